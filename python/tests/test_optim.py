"""The server's optimizers from Python: gddr.Optimizer's text and checks,
register(..., optimizer=), tensor_optimizer(), set_lr() / lr, and names
that C would cut short.

Expected weights are computed here in float32 in the order of
server/optim.c's loops (the build has -ffp-contract=off: no FMA), so the
server's values must come out bit for bit.
"""

import re

import numpy as np
import pytest

import gddr

f32 = np.float32


def adam_numpy(w, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    """server/optim.c's adam over a sequence of pushes, in float32:
    m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g*g,
    w -= lr * (m*bc1) / (sqrt(v*bc2) + eps), where the push making version
    k uses bc1 = 1/(1 - b1^k), bc2 = 1/(1 - b2^k) (computed in double, then
    rounded to float), k = 1 for the first: m*bc1 is m-hat, v*bc2 v-hat."""
    w = w.astype(f32).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    B1, B2 = f32(b1), f32(b2)
    C1, C2 = f32(1) - B1, f32(1) - B2  # as optim.c: 1.0f - (float)beta1
    LR, EPS = f32(lr), f32(eps)
    for k, g in enumerate(grads, start=1):
        bc1, bc2 = f32(1.0 / (1.0 - b1 ** k)), f32(1.0 / (1.0 - b2 ** k))
        d = g.astype(f32)
        m = B1 * m + C1 * d
        v = B2 * v + C2 * (d * d)
        step = (m * bc1) / (np.sqrt(v * bc2) + EPS)
        w = w - LR * step
    return w


# ---- gddr.Optimizer: text and checks, no server ---------------------------------------


def test_optimizer_text_round_trips():
    o = gddr.Optimizer("adam", lr=1e-3)
    assert str(o) == o.text() == "adam lr=0.001"
    assert (o.kind, o.lr, o["lr"]) == ("adam", 0.001, 0.001)
    assert gddr.Optimizer("SGD", lr=0.05, momentum=0.9).text() == "sgd lr=0.05 momentum=0.9"
    assert gddr.Optimizer("adamw", betas=(0.9, 0.98), weight_decay=0.01).text() == \
        "adamw beta1=0.9 beta2=0.98 weight_decay=0.01"
    p = gddr.Optimizer.parse("adamw lr=0.001 betas=0.9,0.98  eps=1e-6")
    assert p == gddr.Optimizer("adamw", lr=0.001, beta1=0.9, beta2=0.98, eps=1e-6)
    assert p == "adamw lr=0.001 beta1=0.9 beta2=0.98 eps=1e-06"
    assert gddr.Optimizer.parse(str(p)) == p
    assert gddr.Optimizer() == "sgd"  # kind only: every value from the server
    assert gddr.OPTIMIZERS == ("sgd", "adam", "adamw", "adagrad")
    # Values survive the text exactly (repr of a double).
    assert gddr.Optimizer.parse(str(gddr.Optimizer("sgd", lr=0.1 + 0.2))).lr == 0.1 + 0.2


@pytest.mark.parametrize("kind,kw,text", [
    ("rmsprop", {}, "kind must be one of sgd, adam, adamw, adagrad"),
    (None, {}, "kind must be one of"),
    ("adam", {"momentum": 0.9}, "adam takes lr, beta1, beta2, eps, weight_decay; not momentum"),
    ("sgd", {"beta1": 0.9}, "sgd takes lr, momentum, weight_decay; not beta1"),
    ("adagrad", {"beta2": 0.9}, "adagrad takes lr, eps, weight_decay; not beta2"),
    ("sgd", {"lr": -0.1}, "lr=-0.1 is not in [0, 1e6]"),
    ("sgd", {"lr": 2e6}, "lr=2000000.0 is not in [0, 1e6]"),
    ("sgd", {"lr": float("nan")}, "lr=nan is not finite"),
    ("sgd", {"lr": "0.1"}, "lr must be a number"),
    ("sgd", {"lr": True}, "lr must be a number"),
    ("sgd", {"momentum": 1.0}, "momentum=1.0 is not in [0, 1)"),
    ("adam", {"beta2": -0.5}, "beta2=-0.5 is not in [0, 1)"),
    ("adam", {"eps": 0.0}, "eps=0.0 must be above 0"),
    ("adamw", {"weight_decay": -1}, "weight_decay=-1.0 must be at least 0"),
    ("adam", {"betas": (0.9,)}, "betas must be two numbers"),
    ("adam", {"betas": (0.9, 0.99), "beta1": 0.9}, "betas or beta1/beta2, not both"),
])
def test_optimizer_refuses_bad_kinds_and_values(kind, kw, text):
    with pytest.raises(ValueError, match=re.escape(text)) as e:
        gddr.Optimizer(kind, **kw)
    assert isinstance(e.value, gddr.InvalidArgument)


@pytest.mark.parametrize("text,msg", [
    ("", "empty"),
    ("adam lr", "'lr' is not key=value"),
    ("adam lr=", "is not key=value"),
    ("adam speed=1", "unknown key 'speed'"),
    ("adam lr=fast", "lr=fast is not a number"),
    ("adam betas=0.9", "betas must be two numbers"),
    ("adam lr=0.1 lr=0.2", "lr given twice"),
    ("lion lr=0.1", "kind must be one of"),
    ("adam lr=0.1\0 momentum=0.9", "NUL"),
])
def test_optimizer_parse_refuses_bad_text(text, msg):
    with pytest.raises(ValueError, match=msg):
        gddr.Optimizer.parse(text)


# ---- names C would cut short ---------------------------------------------------------------


def test_names_with_nul_bytes_are_refused(server, clients):
    """ctypes passes a str with a NUL as a C string cut at the NUL:
    "w\\0evil" would register (or join!) the tensor "w". Refused before
    anything is sent."""
    srv = server(lr=1.0)
    c = clients(srv)
    w = np.zeros(4, np.float32)
    for bad in ("w\0evil", "\0", "layer\0.weight"):
        with pytest.raises(ValueError, match="NUL byte") as e:
            c.register(bad, w)
        assert isinstance(e.value, gddr.InvalidArgument)
        with pytest.raises(ValueError, match="NUL byte"):
            gddr.check_name(bad)
    with pytest.raises(ValueError, match="at most 127"):
        c.register("x" * 128, w)
    with pytest.raises(ValueError, match="non-empty str"):
        c.register("", w)
    assert gddr.check_name("layer0.weight") == b"layer0.weight"
    assert c.tensors == []
    assert c.stats()["pushes"] == 0
    assert "gddr_tensor_version{" not in c.metrics()  # the server holds no tensor
    c.register("w", w)
    assert [t.name for t in c.tensors] == ["w"]


# ---- the server's optimizer ----------------------------------------------------------------


def test_adam_on_the_server_matches_numpy(server, clients):
    """register(optimizer="adam ..."), read it back, push three gradients
    in sync steps: the server's weights are numpy's bias-corrected Adam,
    with t = the version each push makes (1 for the first)."""
    srv = server(mode="sync", lr=0.5)  # the server's lr: not Adam's
    c = clients(srv)
    w0 = np.linspace(-1.0, 1.0, 12, dtype=f32)
    w = w0.copy()
    t = c.register("w", w, optimizer=gddr.Optimizer("adam", lr=0.01, betas=(0.8, 0.99)))
    assert c.tensor_optimizer("w") == "adam lr=0.01 beta1=0.8 beta2=0.99 eps=1e-08 weight_decay=0"
    assert c.tensor_optimizer(t) == c.tensor_optimizer(0)
    rng = np.random.default_rng(3)
    grads = [rng.normal(size=12).astype(f32) for _ in range(3)]
    for k, g in enumerate(grads, start=1):
        c.step([g], [w])
        assert c.version("w") == k
        np.testing.assert_array_equal(w, adam_numpy(w0, grads[:k], 0.01, 0.8, 0.99))
    # Not plain SGD with either lr: Adam's first step is about lr * sign(g).
    first = adam_numpy(w0, grads[:1], 0.01, 0.8, 0.99)
    np.testing.assert_allclose(first, w0 - 0.01 * np.sign(grads[0]), atol=1e-6)
    # An observer sees the same weights.
    with gddr.Client(srv.endpoint, rank=0, world_size=1, observer=True) as o:
        o.register("w", np.zeros(12, f32))
        np.testing.assert_array_equal(o.pull("w"), w)
        assert o.tensor_optimizer("w") == c.tensor_optimizer("w")


def test_adam_lr_from_the_server_and_text_optimizer(server, clients):
    """The optimizer as text; no lr given: the server's [optimizer] lr."""
    srv = server(mode="sync", lr=0.25)
    c = clients(srv)
    w0 = np.array([1.0, -2.0, 0.5, 3.0], f32)
    w = w0.copy()
    c.register("w", w, optimizer="adam")
    assert c.tensor_optimizer("w") == "adam lr=0.25 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0"
    g = np.array([0.5, -1.0, 2.0, 0.0], f32)
    c.step([g], [w])
    np.testing.assert_array_equal(w, adam_numpy(w0, [g], 0.25))


def test_server_default_and_mismatched_registrations(server, clients):
    """A tensor made without an optimizer runs the server's section; the
    first registration decides, a later one naming another optimizer is
    gddr.ConfigError, the same one (or none) joins."""
    srv = server(lr=0.5, momentum=0.9)
    a = clients(srv, rank=0, world_size=2)
    b = clients(srv, rank=1, world_size=2)
    w = np.zeros(6, f32)
    a.register("plain", w)
    assert a.tensor_optimizer("plain") == "sgd lr=0.5 momentum=0.9 weight_decay=0"
    a.register("tuned", w, optimizer="adam lr=0.001")
    with pytest.raises(gddr.ConfigError) as e:
        b.register("tuned", w, optimizer="sgd lr=0.001")
    assert e.value.code == 12 and e.value.name == "GDDR_ECONFIG"
    assert "runs adam lr=0.001" in e.value.message and "asks for sgd" in e.value.message
    with pytest.raises(gddr.ConfigError, match="server's \\[optimizer\\] section"):
        b.register("plain", w, optimizer="adam")
    assert b.tensors == []
    # The same optimizer, spelled otherwise, or none at all: joins.
    b.register("tuned", w, optimizer=gddr.Optimizer("adam", lr=0.001, beta1=0.9, eps=1e-8))
    b.register("plain", w, optimizer=None)
    assert [t.name for t in b.tensors] == ["tuned", "plain"]
    assert b.tensor_optimizer("tuned") == \
        "adam lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0"
    # A bad optimizer is refused before anything is sent.
    with pytest.raises(gddr.InvalidArgument, match="momentum"):
        b.register("other", w, optimizer="adam momentum=0.9")
    assert len(b.tensors) == 2


def test_set_lr_changes_the_applied_step(server, clients):
    """Plain sgd with the server's lr 1: set_lr(0.25) makes the next push
    a step of 0.25 * g, set_lr(0) the tensor's lr again."""
    srv = server(mode="sync", lr=1.0)
    c = clients(srv)
    w = np.full(5, 10.0, f32)
    g = np.array([1.0, 2.0, 4.0, -8.0, 0.5], f32)
    c.register("w", w, optimizer="sgd")
    assert c.lr == 0.0
    c.step([g], [w])
    np.testing.assert_array_equal(w, 10.0 - g)
    c.set_lr(0.25)
    assert c.lr == 0.25
    c.step([g], [w])
    np.testing.assert_array_equal(w, 10.0 - g - 0.25 * g)
    c.lr = 0.0  # the property calls set_lr
    c.step([g], [w])
    np.testing.assert_array_equal(w, 10.0 - 2.25 * g)
    c.lr = 3
    c.step([g], [w])
    np.testing.assert_array_equal(w, 10.0 - 5.25 * g)
    for bad in (-0.5, 2e6, float("nan"), float("inf"), "0.1", None):
        with pytest.raises(gddr.InvalidArgument):
            c.set_lr(bad)
    assert c.lr == 3.0


def test_set_lr_drives_adam_too(server, clients):
    """A push's lr replaces the tensor's in Adam's step as well."""
    srv = server(mode="sync", lr=1.0)
    c = clients(srv)
    w0 = np.array([0.5, -0.5, 2.0], f32)
    w = w0.copy()
    c.register("w", w, optimizer="adam lr=0.1")
    g = np.array([1.0, -3.0, 0.25], f32)
    c.lr = 0.001
    c.step([g], [w])
    np.testing.assert_array_equal(w, adam_numpy(w0, [g], 0.001))
