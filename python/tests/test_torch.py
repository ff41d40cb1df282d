"""gddr.torch and the Fashion-MNIST example. Skipped, with the reason, where
torch cannot be imported (scripts/install-deps.sh installs python3-torch);
the CUDA case needs a GPU and a CUDA build of torch and of the library.
"""

import re

import numpy as np
import pytest

import gddr

from conftest import PY, PYTHON, run

torch = pytest.importorskip("torch", reason="torch cannot be imported: install python3-torch "
                            "(scripts/install-deps.sh does)")
import gddr.torch  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.scale = torch.nn.Parameter(torch.full((4,), 0.5))
        self.frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)


def test_parameter_server_registers_names_and_adopts_the_servers_values(server, clients):
    srv = server(lr=1.0)
    first, second = Tiny(), Tiny()
    with torch.no_grad():
        for p in second.parameters():
            p.fill_(7.0)  # another initialisation: the server's values win
    ps1 = gddr.torch.ParameterServer(first, clients(srv, rank=0, world_size=2))
    ps2 = gddr.torch.ParameterServer(second, clients(srv, rank=1, world_size=2))
    names = ["scale", "lin.weight", "lin.bias"]  # named_parameters() order, requires_grad only
    assert [n for n, _ in ps1.named] == names
    assert [t.name for t in ps1.client.tensors] == names
    for (_, a), (_, b) in zip(ps1.named, ps2.named):
        assert torch.equal(a, b)
    assert torch.equal(second.scale.detach(), torch.full((4,), 0.5))


def test_step_writes_the_servers_parameters_into_the_model(server, clients):
    """lr 1, gradients of 1: every parameter falls by exactly 1 per step, in
    the model's own memory (no copy: the same storage afterwards)."""
    srv = server(lr=1.0, mode="sync")
    model = Tiny()
    with torch.no_grad():
        model.lin.weight.copy_(torch.arange(6.0).view(2, 3))
        model.lin.bias.fill_(0.25)
    storage = model.lin.weight.data_ptr()
    c = clients(srv)
    ps = gddr.torch.ParameterServer(model, c)
    for k in range(1, 3):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        model.scale.grad = None  # no gradient this step: pushed as zeros
        ps.step()
        assert torch.equal(model.lin.weight.detach(), torch.arange(6.0).view(2, 3) - k)
        assert torch.equal(model.lin.bias.detach(), torch.full((2,), 0.25 - k))
        assert torch.equal(model.scale.detach(), torch.full((4,), 0.5))
    assert model.lin.weight.data_ptr() == storage
    assert torch.equal(model.frozen.detach(), torch.zeros(2))  # never registered
    assert c.stats()["versions_total"] == 6  # 3 tensors x 2 sync steps


def test_gradients_train_with_gddr_options(server, clients):
    """A real backward pass with GDDR alpha 0.5 and clipping: the loss goes
    down and the server ends with the worker's parameters."""
    srv = server(lr=0.1, chunk=8)
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.3
    model = torch.nn.Linear(3, 1)
    c = clients(srv, delay_fraction=0.5, clip_norm=5.0)
    ps = gddr.torch.ParameterServer(model, c)
    losses = []
    for _ in range(60):
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        ps.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    ps.pull()
    with gddr.Client(srv.endpoint, rank=0, world_size=1, observer=True) as o:
        o.register("weight", np.zeros(3, np.float32))
        assert np.array_equal(o.pull("weight"), model.weight.detach().numpy().reshape(-1))


def test_bad_models_are_refused(server, clients):
    c = clients(server())
    with pytest.raises(gddr.InvalidArgument, match="float32"):
        gddr.torch.ParameterServer(torch.nn.Linear(2, 2).double(), c)
    with pytest.raises(gddr.InvalidArgument, match="no parameter"):
        gddr.torch.ParameterServer(torch.nn.ReLU(), c)
    assert c.tensors == []


def result(line_text):
    m = re.search(r"^RESULT (.*)$", line_text, re.M)
    assert m, "no RESULT line in:\n" + line_text
    return dict(kv.split("=", 1) for kv in m.group(1).split())


def test_fashion_mnist_example_runs_a_few_steps(server, tmp_path):
    """The example, two workers of 6 steps on synthetic images (one with
    GDDR alpha 0.4), then the observer that scores the server's model."""
    import subprocess

    srv = server(lr=0.05, momentum=0.5)
    ex = PY / "examples" / "fashion_mnist.py"
    common = ["--server", srv.endpoint, "--world", "2", "--synthetic", "256", "--steps", "6",
              "--batch", "16", "--progress", "0"]
    procs = [subprocess.Popen([PYTHON, ex, "--rank", str(r)] + common +
                              (["--delay-fraction", "0.4"] if r == 1 else []),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    res = [result(o) for o in outs]
    assert [r["rank"] for r in res] == ["0", "1"]
    assert [r["steps"] for r in res] == ["6", "6"]
    assert "CNN on synthetic data: 6 steps, batch 16, 8 tensors, 80202 parameters" in outs[0]
    # Dense: every value of every step pushed; GDDR: fewer (the rest was
    # held, then flushed at close in a push of its own).
    assert int(res[0]["values_pushed"]) == 6 * 80202
    assert int(res[1]["values_pushed"]) < 6 * 80202
    for r in res:
        assert 0.0 <= float(r["test_accuracy"]) <= 1.0
    final = result(run([PYTHON, ex, "--server", srv.endpoint, "--evaluate", "--synthetic", "256"]))
    assert final["server_model"] == "1"
    # async: each push of a tensor is one version; 12 steps, plus the flush
    # of worker 1's residual for the tensors it still held.
    assert 12 <= int(final["version"]) <= 13
    assert 0.0 <= float(final["test_accuracy"]) <= 1.0


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device for torch (scripts/gpu-check.sh runs this on a GPU)")
def test_cuda_parameters_take_the_device_path(server, clients):
    """A CUDA model: its gradients and parameters go to the library as
    device pointers (or through host copies with a CPU-only library), with
    the same values a CPU model gets."""
    srv_gpu, srv_cpu = server(lr=0.5, chunk=4), server(lr=0.5, chunk=4)
    results = []
    for srv, dev in ((srv_gpu, "cuda"), (srv_cpu, "cpu")):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3).to(dev)
        ps = gddr.torch.ParameterServer(model, clients(srv, delay_fraction=0.5))
        assert ps.cuda == (dev == "cuda")
        assert ps.staged == (dev == "cuda" and not gddr.has_cuda)
        x = torch.arange(8.0, device=dev).view(2, 4) / 8
        for _ in range(5):
            model.zero_grad()
            model(x).pow(2).sum().backward()
            ps.step()
        results.append([p.detach().cpu() for p in model.parameters()])
    for a, b in zip(*results):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
