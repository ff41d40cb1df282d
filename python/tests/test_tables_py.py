"""Sparse tables from Python: gddr.Client.register_table / gddr.Table
(values computed and compared: the documented initial values, an SGD step,
repeated keys summed, inference pulls creating nothing), the errors with
the server's sentence, gddr.torch.Embedding against torch's own sparse
nn.Embedding + SGD, the empty push of a sync step, and the skip-gram
example on synthetic text (its held-out loss falls clearly).
"""

import re
import subprocess

import numpy as np
import pytest
import torch

import gddr
import gddr.torch

from conftest import PY, PYTHON, WAIT_S

M64 = (1 << 64) - 1
G = 0x9e3779b97f4a7c15


def sm(x):
    """SplitMix64's output function (docs/protocol.md, "Several servers")."""
    x = (x + G) & M64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def initial_uniform(seed, key, dim, scale):
    """TINIT_UNIFORM's row as docs/protocol.md "Tables" writes it."""
    row = []
    for i in range(dim):
        u = np.float32((sm(seed ^ sm(key ^ ((i * G) & M64))) >> 40) * 2.0 ** -24)
        row.append(np.float32(scale) * (np.float32(2) * u - np.float32(1)))
    return np.array(row, dtype=np.float32)


def rows_metric(client, table):
    m = re.search(r'^gddr_table_rows\{table="%s"\} (\d+)$' % table, client.metrics(), re.M)
    return int(m.group(1)) if m else 0


def test_table_round_trip(server, clients):
    srv = server(lr=0.5)
    c = clients(srv)
    t = c.register_table("emb", 4, init="uniform", init_scale=0.5, init_seed=11)
    assert (t.key, t.dim) == ("emb", 4) and c.tables == {"emb": t}
    assert c.register_table("emb", 4).id == t.id  # a lookup: the first registration decides
    # int64 keys are the uint64 keys of the same bits, without a copy.
    k64 = np.array([7, -1, 7, 0], dtype=np.int64)
    ku = gddr.as_keys(k64)
    assert ku.dtype == np.uint64 and np.shares_memory(ku, k64) and int(ku[1]) == M64
    assert gddr.as_keys([7, -1, 2 ** 64 - 1]).tolist() == [7, M64, M64]
    w0 = t.pull(k64)
    assert w0.shape == (4, 4) and w0.dtype == np.float32 and t.version == 0
    for r, key in enumerate([7, M64, 7, 0]):
        np.testing.assert_array_equal(w0[r], initial_uniform(11, key, 4, 0.5))
    # Key 7 twice in a push: its gradients are summed, one SGD step at lr 0.5.
    g = np.arange(1, 17, dtype=np.float32).reshape(4, 4) / 4
    assert t.push(k64, g) == 1
    w1 = t.pull(np.array([7, M64, 0], dtype=np.uint64))
    want = np.stack([w0[0] - np.float32(0.5) * (g[0] + g[2]),
                     w0[1] - np.float32(0.5) * g[1], w0[3] - np.float32(0.5) * g[3]])
    np.testing.assert_array_equal(w1, want)
    assert rows_metric(c, "emb") == 3
    # Inference: an unknown key reads as zeros and nothing is created.
    wi = t.pull([7, 123456789], create=False)
    np.testing.assert_array_equal(wi[0], w1[0])
    np.testing.assert_array_equal(wi[1], np.zeros(4, np.float32))
    assert rows_metric(c, "emb") == 3
    # Empty pull and push; grads of another float dtype are converted.
    assert t.pull([]).shape == (0, 4)
    assert t.push([], np.zeros((0, 4))) == 2
    t.push([0], np.ones(4, dtype=np.float64))
    np.testing.assert_array_equal(t.pull([0])[0], w1[2] - np.float32(0.5))
    # An observer reads the same rows and cannot push.
    o = clients(srv, observer=True)
    to = o.register_table("emb", 4)
    np.testing.assert_array_equal(to.pull([7, M64]), t.pull([7, M64]))
    with pytest.raises(gddr.WorkerError, match="observer cannot push"):
        to.push([7], np.ones(4, np.float32))


def test_table_errors(server, clients):
    c = clients(server())
    c.register_table("emb", 4)
    with pytest.raises(gddr.LengthMismatch, match="rows of 4 values, not 5"):
        c.register_table("emb", 5)
    # The server's own sentence for an optimizer tables do not offer.
    with pytest.raises(gddr.InvalidArgument, match="not offered for table rows"):
        c.register_table("mom", 4, optimizer="sgd lr=0.1 momentum=0.9")
    for kw, words in [({"init": "gauss"}, "init must be one of"),
                      ({"admit": "never"}, "admit must be one of"),
                      ({"max_rows": -1}, "max_rows"), ({"admit_count": 1.5}, "admit_count")]:
        with pytest.raises(gddr.InvalidArgument, match=words):
            c.register_table("x", 4, **kw)
    with pytest.raises(gddr.InvalidArgument, match="dim"):
        c.register_table("x", 0)
    t = c.register_table("emb", 4)
    with pytest.raises(gddr.LengthMismatch, match="3 gradient values for 1 keys"):
        t.push([1], np.ones(3, np.float32))
    with pytest.raises(gddr.InvalidArgument, match="integers"):
        t.pull(np.array([1.5]))
    with pytest.raises(gddr.LengthMismatch):
        t.pull([1, 2], out=np.empty((1, 4), np.float32))


def test_embedding_pushes_the_summed_gradients(server, clients):
    """forward + backward of gddr.torch.Embedding leave the server's rows
    where torch's own nn.Embedding(sparse=True) + SGD leaves its weights:
    repeated ids summed, negative ids the uint64 keys of their bits."""
    lr, dim = 0.25, 3
    srv = server()
    c = clients(srv)
    emb = gddr.torch.Embedding(c, "e", dim, init="normal", init_scale=1.0, init_seed=3,
                               optimizer="sgd lr=%g" % lr)
    assert list(emb.parameters()) == []
    ids = torch.tensor([[5, -2, 5], [9, 5, -2]])  # 5 three times, -2 twice
    vocab = torch.tensor([5, -2, 9])
    local = torch.tensor([[0, 1, 0], [2, 0, 1]])   # ids as indices into vocab
    ref = torch.nn.Embedding(3, dim, sparse=True)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    pushed = []
    push = emb.table.push
    emb.table.push = lambda k, g: pushed.append((k.copy(), g.copy())) or push(k, g)
    w = torch.linspace(-1, 1, 6 * dim).view(2, 3, dim)
    for step in range(3):
        with torch.no_grad():  # the reference starts every step from the server's rows
            ref.weight.copy_(torch.from_numpy(emb.table.pull(vocab.numpy())))
        out = emb(ids)
        assert out.shape == (2, 3, dim) and out.requires_grad
        torch.testing.assert_close(out, ref(local), rtol=0, atol=0)
        ((out * w).sum() + (out ** 2).sum()).backward()   # pushes
        assert emb.step() == step + 1                    # async: nothing more to push
        opt.zero_grad()
        ((ref(local) * w).sum() + (ref(local) ** 2).sum()).backward()
        # One push of the 3 unique keys (sorted as int64), each row's uses summed.
        keys, g = pushed[-1]
        assert len(pushed) == step + 1
        assert keys.tolist() == [2 ** 64 - 2, 5, 9]
        dense = ref.weight.grad.to_dense()
        torch.testing.assert_close(torch.from_numpy(g), dense[[1, 0, 2]], rtol=1e-6, atol=1e-6)
        opt.step()
        rows = torch.from_numpy(emb.table.pull(vocab.numpy(), create=False))
        torch.testing.assert_close(rows, ref.weight.detach(), rtol=1e-6, atol=1e-6)
    # eval(): an inference pull, no gradient, nothing created.
    emb.eval()
    with torch.no_grad():
        z = emb(torch.tensor([5, 77]))
    assert not z.requires_grad and torch.equal(z[1], torch.zeros(dim))
    assert rows_metric(c, "e") == 3


def test_embedding_sync_step_with_an_idle_worker(server, clients):
    """Sync, two workers: worker 1 has no ids this step and its step()
    makes the empty push that completes the step; worker 0's push="step"
    collects two backward passes into one push (a row in both summed);
    the server averages over the 2 workers."""
    srv = server(mode="sync", workers=2)
    a = clients(srv, rank=0, world_size=2)
    b = clients(srv, rank=1, world_size=2)
    ea = gddr.torch.Embedding(a, "s", 2, push="step", optimizer="sgd lr=1")
    eb = gddr.torch.Embedding(b, "s", 2, optimizer="sgd lr=1")
    ea(torch.tensor([1, 2])).sum().backward()
    (3 * ea(torch.tensor([2]))).sum().backward()
    assert ea.table.version == 0  # collected, not pushed
    ea.step()
    eb.step()                     # nothing used: the empty push
    rows = a.register_table("s", 2).pull([1, 2], min_version=1)
    assert a.tables["s"].version == 1
    # Zero rows, gradients 1 and 1 + 3, halved (two workers), lr 1.
    np.testing.assert_array_equal(rows, np.array([[-0.5, -0.5], [-2, -2]], np.float32))


def run_skipgram(*extra):
    r = subprocess.run([PYTHON, str(PY / "examples" / "skipgram.py"), "--synthetic", "40000",
                        "--steps", "60", "--batch", "256", "--dim", "16", "--eval-pairs", "4000",
                        "--quiet"] + list(extra), capture_output=True, text=True,
                       timeout=WAIT_S * 8)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return {k: v for k, v in (kv.split("=") for kv in line.split()[1:])}


@pytest.mark.parametrize("extra", [("--workers", "3"),
                                   ("--workers", "2", "--mode", "sync", "--servers", "2")])
def test_skipgram_synthetic_learns(extra):
    """The example end to end (its own servers and worker processes): the
    model the servers keep has a held-out loss well below the initial
    (1 + K) ln 2, and the nearest neighbours of topic words share their
    topic far above chance (1 in 40)."""
    res = run_skipgram(*extra)
    initial, final = float(res["initial_loss"]), float(res["heldout_loss"])
    assert abs(initial - 6 * np.log(2)) < 1e-3
    assert final < initial - 1.0, res
    assert float(res["topic_precision"]) > 0.2, res
