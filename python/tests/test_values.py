"""Values through the Python client: exact arithmetic against a real
gddr-ps, the C client's results reproduced bit for bit, async tickets,
stats, metrics and counters, ranks from the environment, INI files, and
the client's lifetime.

The learning rates and gradients of the exact tests make every product
exact in float32, so the expected values do not depend on rounding.
"""

import numpy as np
import pytest

import gddr

from conftest import run


def observer_values(srv, key, n):
    """The server's values of `key`, pulled by an observer (changes nothing)."""
    with gddr.Client(srv.endpoint, rank=0, world_size=1, observer=True) as o:
        o.register(key, np.zeros(n, np.float32))
        return o.pull(key), o.version(key)


def test_push_pull_exact(server, clients):
    srv = server(lr=1.0)
    c = clients(srv)
    w = np.arange(8, dtype=np.float32)
    t = c.register("w", w)
    assert (t.name, t.n, t.id) == ("w", 8, 0)
    assert c.version("w") == 0
    assert c.pull("w") is not w  # a new array when no `out` is given
    g = np.ones(8, np.float32)
    assert c.push("w", g) == 1
    assert c.push(t, g * 2) == 2
    out = np.full(8, np.nan, np.float32)
    assert c.pull(0, out) is out  # filled in place
    np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32) - 3.0)
    assert c.version("w") == 2
    # The caller's array was only read.
    np.testing.assert_array_equal(w, np.arange(8, dtype=np.float32))


def test_step_in_place_sync(server, clients):
    """gddr_step writes the next parameters into the caller's arrays, of any
    shape as long as they are C-contiguous float32 of the right size."""
    srv = server(mode="sync", lr=0.5)
    c = clients(srv)
    a = np.full((2, 3), 4.0, np.float32)
    b = np.zeros(5, np.float32)
    c.register("a", a)
    c.register("b", b)
    ga, gb = np.full((2, 3), 2.0, np.float32), np.full(5, -4.0, np.float32)
    for k in range(1, 4):
        c.step([ga, gb], [a, b])
        np.testing.assert_array_equal(a, np.full((2, 3), 4.0 - k, np.float32))
        np.testing.assert_array_equal(b, np.full(5, 2.0 * k, np.float32))
    assert [c.version(i) for i in range(2)] == [3, 3]
    s = c.stats()
    assert (s["pushes"], s["mode"], s["worker_pushes"]) == (6, "sync", 6)
    assert c.counters()["steps"] == 3


def py_train(endpoint, key, n, steps, alpha, dc, clip, bits=0):
    """What c_peer train does, through the Python package."""
    target = ((np.arange(n) % 7).astype(np.float64) * 0.37 - 1.0).astype(np.float32)
    w = np.zeros(n, np.float32)
    g = np.empty_like(w)
    c = gddr.Client(endpoint, rank=0, world_size=1, delay_fraction=alpha, dc_lambda=dc,
                    clip_norm=clip, pull_delta_bits=bits)
    with c:
        c.register(key, w)
        c.pull(key, w)
        for _ in range(steps):
            np.subtract(w, target, out=g)
            c.step([g], [w])
        k = c.counters()
    return w, k


@pytest.mark.parametrize("alpha,dc,clip,bits", [(0.0, 0.0, 0.0, 0), (0.4, 0.0, 0.0, 0), (0.6, 0.5, 1.0, 0),
                                                (0.4, 0.0, 0.0, 8)],
                         ids=["dense", "gddr-0.4", "gddr-0.6+dc+clip", "gddr-0.4+8-bit-pulls"])
def test_bit_for_bit_with_the_c_client(server, c_peer, alpha, dc, clip, bits):
    """The same steps from C and from Python, each on its own server of the
    same configuration, end with the same bits: on the client, on the
    server, and the same bytes on the wire."""
    n, steps, key = 3000, 30, "peer.w"
    cfg = dict(lr=0.1, chunk=256)
    s_c, s_py = server(**cfg), server(**cfg)
    out = run([c_peer, "train", s_c.endpoint, key, n, steps, alpha, dc, clip, bits]).splitlines()
    w_c = np.array([int(h, 16) for h in out[0].split()[1:]], dtype=np.uint32).view(np.float32)
    bytes_c, values_c = map(int, out[1].split()[1:])
    w_py, k = py_train(s_py.endpoint, key, n, steps, alpha, dc, clip, bits)
    assert w_c.view(np.uint32).tolist() == w_py.view(np.uint32).tolist()
    assert k["values_pushed"] == values_c
    # The headers differ only by varint lengths (each client draws a random
    # session id, which is shorter now and then): at most 9 bytes a message,
    # with one push and one pull message a step (and a few more at start).
    assert abs(k["bytes_pushed"] - bytes_c) <= 9 * (2 * steps + 8), (k["bytes_pushed"], bytes_c)
    assert k["bytes_pushed"] >= 4 * values_c
    if alpha > 0:
        assert values_c < n * steps, "GDDR held some chunks back"
    if bits:
        assert k["bytes_pulled"] < n * 4 * steps / 2, "8-bit pulls: about a quarter of the bytes"
    # What the servers keep (after the residual flush at close) agrees too.
    v_c, ver_c = observer_values(s_c, key, n)
    v_py, ver_py = observer_values(s_py, key, n)
    assert v_c.view(np.uint32).tolist() == v_py.view(np.uint32).tolist()
    assert ver_c == ver_py >= steps
    assert not np.array_equal(v_py, np.zeros(n, np.float32))


def test_async_tickets(server, clients):
    srv = server(lr=1.0)
    c = clients(srv)
    c.register("t", np.zeros(4, np.float32))
    tickets = [c.push_async("t", np.full(4, 0.5, np.float32)) for _ in range(3)]
    assert [tk.wait() for tk in tickets] == [1, 2, 3]
    assert all(tk.done for tk in tickets)
    pk = c.pull_async("t")
    assert pk.kind == "pull" and not pk.done
    assert pk.wait(timeout_ms=10000) == 3
    np.testing.assert_array_equal(pk.out, np.full(4, -1.5, np.float32))
    assert pk.wait() == 3  # a finished ticket answers again from Python
    # A pull parked for a version that comes later: the wait times out and
    # the library forgets the ticket (its late reply is dropped, `out` is
    # left alone); a pull sent after the push gets the values.
    out = np.zeros(4, np.float32)
    parked = c.pull_async("t", out, min_version=4)
    with pytest.raises(gddr.Timeout) as e:
        parked.wait(timeout_ms=50)
    assert e.value.code == 3 and not parked.done
    with pytest.raises(gddr.UnknownTicket) as e:
        parked.wait()
    assert e.value.code == 19
    assert c.push_async("t", np.ones(4, np.float32)).wait() == 4
    assert c.pull_async("t", out, min_version=4).wait() == 4
    np.testing.assert_array_equal(out, np.full(4, -2.5, np.float32))
    # Tags: a push computed on version 2 is measured 2 updates stale.
    assert c.push("t", np.zeros(4, np.float32), birth_version=2) == 5
    assert c.stats()["staleness_max"] == 2


def test_pipelined_steps(server, clients):
    srv = server(mode="sync", lr=1.0)
    c = clients(srv)
    w = np.zeros(3, np.float32)
    c.register("p", w)
    g = np.ones(3, np.float32)
    c.step_submit([g])
    g[:] = 2.0  # submit copied the gradient: this does not change step 1
    c.step_submit([g])
    c.step_wait([w])
    np.testing.assert_array_equal(w, np.full(3, -1.0, np.float32))
    c.step_wait([w])
    np.testing.assert_array_equal(w, np.full(3, -3.0, np.float32))


def test_stats_metrics_counters_info(server, clients):
    srv = server(lr=0.5, chunk=64)
    c = clients(srv)
    info = c.info()
    assert (info["mode"], info["chunk"], info["rank"], info["world_size"]) == ("async", 64, 0, 1)
    c.register("m.w", np.zeros(100, np.float32))
    for _ in range(3):
        c.push("m.w", np.ones(100, np.float32))
    c.pull("m.w")
    k = c.counters()
    assert k["values_pushed"] == 300
    assert k["bytes_pushed"] > 1200 and k["bytes_pulled"] > 400
    s = c.stats()
    assert (s["pushes"], s["versions_total"], s["rejected"]) == (3, 3, 0)
    assert len(s["staleness_hist"]) == 17 and sum(s["staleness_hist"]) == 3
    m = c.metrics()
    assert "gddr_pushes_total 3\n" in m
    assert 'gddr_tensor_version{tensor="m.w"} 3\n' in m
    c.request_checkpoint()  # no checkpoint_dir: acknowledged, nothing written


def test_rank_and_world_from_the_environment(server, monkeypatch):
    """rank=None and world_size=None: the C library's variables decide."""
    srv = server(lr=1.0)
    monkeypatch.setenv("GDDR_RANK", "2")
    monkeypatch.setenv("GDDR_WORLD_SIZE", "3")
    with gddr.Client(srv.endpoint) as c:
        assert (c.rank, c.world_size) == (2, 3)  # as the library resolved them
        assert c.info()["world_size"] == 3
        c.register("e", np.zeros(2, np.float32))
        c.push("e", np.ones(2, np.float32))
        assert "gddr_worker_pushes_total{rank=\"2\"} 1" in c.metrics()
    monkeypatch.setenv("GDDR_RANK", "3")  # not below GDDR_WORLD_SIZE
    with pytest.raises(gddr.WorkerError) as e:
        gddr.Client(srv.endpoint)
    assert e.value.code == 18


def test_from_ini(server, tmp_path):
    srv = server(lr=1.0)
    ini = tmp_path / "client.ini"
    ini.write_text("[client]\nserver = %s\nrank = 1\nworld_size = 2\ntimeout_ms = 4000\n"
                   % srv.endpoint)
    with gddr.Client.from_ini(ini) as c:
        assert c.rank == 1
        c.register("ini", np.zeros(2, np.float32))
        assert c.push("ini", np.ones(2, np.float32)) == 1
    with gddr.Client.from_ini(ini, rank=0) as c:  # a keyword wins over the file
        assert c.rank == 0
    bad = tmp_path / "bad.ini"
    bad.write_text("[client]\nserver = %s\ndelay_fraction = 2\n" % srv.endpoint)
    with pytest.raises(gddr.ConfigError) as e:
        gddr.Client.from_ini(bad)
    assert e.value.code == 12
    assert "bad.ini:3" in e.value.message and "delay_fraction" in e.value.message


def test_close_says_bye(server, clients):
    srv = server(lr=1.0, mode="sync")
    watcher = clients(srv, observer=True)
    with gddr.Client(srv.endpoint, rank=0, world_size=1) as c:
        c.register("x", np.zeros(1, np.float32))
        assert watcher.stats()["live_workers"] == 1
    assert c.closed
    assert watcher.stats()["live_workers"] == 0
    with pytest.raises(gddr.StateError) as e:
        c.pull("x")
    assert e.value.code == 16 and "closed" in e.value.message
    c.close()  # twice is fine
