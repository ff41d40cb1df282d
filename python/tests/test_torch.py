"""gddr.torch and the Fashion-MNIST example. Skipped, with the reason, where
torch cannot be imported (scripts/install-deps.sh installs python3-torch);
the CUDA case needs a GPU and a CUDA build of torch and of the library.
"""

import os
import re
import shutil

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


def test_tiny_lm_lockstep_repeats(server):
    """tiny_lm.py --lockstep 3: three workers in one process, stepped in
    turn against an async Adam server, with GDDR holds and 8-bit delta
    pulls. After the first round every push is exactly 2 versions stale,
    and a second run on a fresh server repeats the first to the last digit:
    the workers' losses and staleness, and the server's final model."""
    ex = PY / "examples" / "tiny_lm.py"
    model = ["--synthetic", "20000", "--layers", "1", "--d-model", "32", "--heads", "2",
             "--context", "32", "--batch", "4", "--eval-windows", "16"]
    steps = 8
    runs = []
    for _ in range(2):
        srv = server(mode="async", kind="adam", lr=0.001)
        out = run([PYTHON, ex, "--server", srv.endpoint, "--lockstep", "3", "--steps", str(steps),
                   "--delay-fraction", "0.4", "--pull-delta-bits", "8", "--progress", "0"] + model)
        lines = sorted(l for l in out.splitlines() if l.startswith("RESULT"))
        assert len(lines) == 3, out
        final = result(run([PYTHON, ex, "--server", srv.endpoint, "--evaluate"] + model))
        # Compared: what the run computed; not the bytes on the wire, which
        # count heartbeats and, on a loaded machine, requests sent again
        # after a wait timed out (the server applies each push once).
        res = [result(l) for l in lines]
        keep = ("rank", "train_loss", "steps", "mean_staleness", "max_staleness")
        runs.append(([{k: x[k] for k in keep} for x in res], final["heldout_loss"],
                     final["version"], res))
    assert runs[0][:3] == runs[1][:3], (runs[0], runs[1])
    for r, res in enumerate(runs[0][3]):
        assert res["rank"] == str(r)
        assert res["max_staleness"] == "2"
        # rank r's first push is r versions stale, each later one 2
        assert float(res["mean_staleness"]) == pytest.approx((r + 2 * (steps - 1)) / steps, abs=1e-3)
        # GDDR: part of each step held (and flushed at close), so fewer
        # values pushed than 8 dense steps of the model's 21,984 values
        assert 0 < int(res["values_pushed"]) < steps * 21984
    assert 3 * steps <= int(runs[0][2]) <= 3 * steps + 3  # + the flushes at close


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


# ---- the server's optimizer, torch optimizers refused, lr schedules ------------------


def test_parameter_server_registers_with_the_optimizer(server, clients):
    srv = server(lr=0.5, mode="sync")
    model = Tiny()
    ps = gddr.torch.ParameterServer(model, clients(srv, rank=0, world_size=2),
                                    optimizer="adam lr=0.001")
    want = "adam lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0"
    assert ps.optimizer_text == want
    assert ps.optimizers() == {"scale": want, "lin.weight": want, "lin.bias": want}
    assert ps.lr == 0.0
    ps.lr = 0.125
    assert ps.lr == ps.client.lr == 0.125
    # Another worker asking for another optimizer: the server's config error.
    other = clients(srv, rank=1, world_size=2)
    with pytest.raises(gddr.ConfigError, match="runs adam"):
        gddr.torch.ParameterServer(Tiny(), other, optimizer=gddr.Optimizer("sgd", lr=0.1))
    with pytest.raises(ValueError, match="kind must be one of"):
        gddr.torch.ParameterServer(Tiny(), other, optimizer="lion")
    assert other.tensors == []
    # "" and None: the server's section; no check against the first one's.
    assert gddr.torch.ParameterServer(Tiny(), other, optimizer="").optimizer_text == want


def test_adam_through_the_parameter_server(server, clients):
    """One worker, sync: ps.step() with the server running Adam gives the
    weights of numpy's Adam on the same gradients."""
    from test_optim import adam_numpy

    srv = server(lr=0.5, mode="sync")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    w0 = [p.detach().numpy().reshape(-1).copy() for p in model.parameters()]
    ps = gddr.torch.ParameterServer(model, clients(srv), optimizer=gddr.Optimizer("adam", lr=0.01))
    x = torch.tensor([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]])
    grads = [[], []]
    for _ in range(3):
        model.zero_grad()
        model(x).pow(2).sum().backward()
        for i, p in enumerate(model.parameters()):
            grads[i].append(p.grad.detach().numpy().reshape(-1).copy())
        ps.step()
    for p, w, gs in zip(model.parameters(), w0, grads):
        np.testing.assert_array_equal(p.detach().numpy().reshape(-1), adam_numpy(w, gs, 0.01))


def test_a_torch_optimizer_stepping_the_parameters_is_refused(server, clients):
    """torch.optim.SGD(model.parameters()).step() updates the parameters in
    place (their _version moves): ps.step() refuses, before sending."""
    srv = server(lr=0.1, mode="sync")
    model = Tiny()
    c = clients(srv)
    ps = gddr.torch.ParameterServer(model, c)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.zero_grad()
    model.lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    with pytest.raises(RuntimeError) as e:
        ps.step()
    msg = str(e.value)
    assert "'lin.weight'" in msg and "changed in place" in msg
    assert "The server runs the optimizer" in msg and "torch optimizer" in msg
    assert "ServerOptimizer" in msg and "optimizer=" in msg
    assert c.stats()["pushes"] == 0  # nothing was sent
    with pytest.raises(RuntimeError, match="changed in place"):
        ps.pull()
    # Discarding the local change: the server's values win again.
    ps.pull(discard_local=True)
    assert torch.equal(model.scale.detach(), torch.full((4,), 0.5))
    model.zero_grad()
    ps.step()  # and the loop goes on


def test_a_loop_without_a_torch_optimizer_is_not_refused(server, clients):
    """Gradients accumulating in .grad (two backward passes per step),
    zero_grad (both ways), train()/eval(), forward passes, pulls and
    ServerOptimizer leave the parameters' _version alone: no refusal."""
    srv = server(lr=0.1, mode="sync")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Dropout(0.1), torch.nn.Linear(4, 1))
    ps = gddr.torch.ParameterServer(model, clients(srv))
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    versions = [p._version for p in model.parameters()]
    for k in range(4):
        model.train()
        model.zero_grad(set_to_none=(k % 2 == 0))
        for _ in range(2):
            torch.nn.functional.mse_loss(model(x), y).backward()
        ps.step()
        model.eval()
        with torch.no_grad():
            model(x)
        ps.pull()
    opt = gddr.torch.ServerOptimizer(ps)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert [p._version for p in model.parameters()] == versions  # written through pointers
    assert ps.client.version(0) == 6


def test_server_optimizer_drives_a_cosine_schedule(server, clients):
    """CosineAnnealingLR on ServerOptimizer, plain sgd on the server: the
    weights are w0 - sum_t lr_t * g_t, lr_t the schedule's (float32, in the
    server's order: w = w - float(lr_t) * g_t)."""
    srv = server(lr=1.0, mode="sync")
    model = Tiny()
    ps = gddr.torch.ParameterServer(model, clients(srv), optimizer="sgd lr=0.5")
    opt = gddr.torch.ServerOptimizer(ps)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups[0]["lr"] == 0.5  # the server's lr for the model
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.05)
    w = [p.detach().numpy().reshape(-1).copy() for _, p in ps.named]
    lrs = []
    for t in range(6):
        opt.zero_grad()
        g = [torch.full_like(p, float(t + 1)) * torch.linspace(-1, 1, p.numel()).view_as(p)
             for _, p in ps.named]
        for (_, p), gt in zip(ps.named, g):
            p.grad = gt.clone()
        lr = opt.param_groups[0]["lr"]
        lrs.append(lr)
        opt.step()
        assert ps.lr == lr
        for i, gt in enumerate(g):
            w[i] = w[i] - np.float32(lr) * gt.numpy().reshape(-1)
        sched.step()
        for (_, p), wi in zip(ps.named, w):
            np.testing.assert_array_equal(p.detach().numpy().reshape(-1), wi)
    # The schedule did change the lr: 0.5 down to eta_min and up again.
    assert lrs[0] == 0.5 and min(lrs) == pytest.approx(0.05) and len(set(lrs)) >= 4
    assert lrs == pytest.approx([0.05 + 0.45 * (1 + np.cos(np.pi * t / 4)) / 2 for t in range(6)])


def test_server_optimizer_lambda_and_callable_schedules_reach_zero(server, clients):
    """A schedule reaching exactly 0 is sent as 5e-324 (0 on the wire would
    be the tensor's lr): plain sgd does not move. A plain callable works
    as well as LambdaLR, and StepLR is accepted."""
    srv = server(lr=1.0, mode="sync")
    model = torch.nn.Linear(2, 1)
    ps = gddr.torch.ParameterServer(model, clients(srv), optimizer="sgd")
    opt = gddr.torch.ServerOptimizer(ps, lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: [1.0, 0.5, 0.0, 0.0][s])
    before = model.weight.detach().clone()
    seen = []
    for _ in range(3):
        opt.zero_grad()
        model.weight.grad = torch.ones_like(model.weight)
        model.bias.grad = torch.ones_like(model.bias)
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == [0.5, 0.25, 0.0]
    assert ps.lr == gddr.torch.MIN_LR == 5e-324
    assert torch.equal(model.weight.detach(), before - 0.75)  # the lr-0 step moved nothing

    opt2 = gddr.torch.ServerOptimizer(ps, schedule=lambda k: 0.125 * (k + 1))
    for k in range(2):
        model.weight.grad = torch.ones_like(model.weight)
        opt2.step()
        assert opt2.param_groups[0]["lr"] == 0.125 * (k + 1)
    assert torch.equal(model.weight.detach(), before - 0.75 - 0.125 - 0.25)
    torch.optim.lr_scheduler.StepLR(gddr.torch.ServerOptimizer(ps, lr=0.1), step_size=2)
    with pytest.raises(ValueError, match="one param group"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="not in"):
        opt.step()


def test_fashion_mnist_example_with_a_server_optimizer_and_schedules(server, tmp_path):
    """--optimizer "adam lr=0.001" registers the CNN with Adam on the
    server; --lr-schedule cosine / step drive its lr (one worker each)."""
    import subprocess

    srv = server(lr=0.05, momentum=0.5, mode="sync")
    ex = PY / "examples" / "fashion_mnist.py"
    common = ["--server", srv.endpoint, "--world", "2", "--synthetic", "256", "--steps", "6",
              "--batch", "16", "--progress", "0", "--optimizer", "adam lr=0.001"]
    procs = [subprocess.Popen([PYTHON, ex, "--rank", str(r), "--lr-schedule", sched] + common,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, sched in enumerate(("cosine", "step"))]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    adam = "optimizer adam lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0"
    assert adam + ", lr schedule cosine" in outs[0]
    assert adam + ", lr schedule step" in outs[1]
    assert [result(o)["steps"] for o in outs] == ["6", "6"]
    with gddr.Client(srv.endpoint, rank=0, world_size=1, observer=True) as o:
        o.register("fc2.bias", np.zeros(10, np.float32))
        assert o.tensor_optimizer("fc2.bias") == adam[len("optimizer "):]
        assert o.version("fc2.bias") == 6  # 6 sync steps
    # Without --optimizer, the server's section (sgd with momentum).
    out = subprocess.run([PYTHON, ex, "--server", server(lr=0.05, momentum=0.5).endpoint,
                          "--world", "1", "--rank", "0", "--synthetic", "64", "--steps", "2",
                          "--progress", "0"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "optimizer sgd lr=0.05 momentum=0.5 weight_decay=0, lr schedule none" in out.stdout
    bad = subprocess.run([PYTHON, ex, "--server", srv.endpoint, "--world", "2", "--rank", "0",
                          "--synthetic", "64", "--steps", "1", "--optimizer", "adam momentum=0.9"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "adam takes lr, beta1" in bad.stderr


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="no torchrun (python3-torch has it)")
def test_fashion_mnist_example_under_torchrun(server, tmp_path):
    """torchrun starts two workers of the example; each takes its rank and
    the world size from torchrun's environment (RANK, WORLD_SIZE), so the
    sync server steps with both. `-r 1 -t 1`: Debian's torch 1.13 on
    Python 3.11 fails at start with its default redirects ("0" parses to
    None there: a Flag's zero member is not iterated); newer torch takes
    the same flags."""
    import subprocess

    srv = server(lr=0.05, mode="sync", workers=2)
    ex = PY / "examples" / "fashion_mnist.py"
    env = dict(os.environ)
    for k in ("GDDR_RANK", "GDDR_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(k, None)
    r = subprocess.run(["torchrun", "--standalone", "--nproc_per_node", "2", "-r", "1", "-t", "1",
                        str(ex), "--server", srv.endpoint, "--synthetic", "256", "--steps", "5",
                        "--batch", "16", "--progress", "0", "--quiet"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    res = [dict(kv.split("=", 1) for kv in m.split())
           for m in re.findall(r"RESULT (.*)$", r.stdout, re.M)]
    assert sorted(x["rank"] for x in res) == ["0", "1"], r.stdout
    assert [x["steps"] for x in res] == ["5", "5"]
    final = result(run([PYTHON, ex, "--server", srv.endpoint, "--evaluate", "--synthetic", "256"]))
    # sync with both workers: one version a step
    assert final["version"] == "5"
