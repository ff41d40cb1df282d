#!/usr/bin/python3
"""fashion_mnist.py -- one worker of a PyTorch CNN trained on Fashion-MNIST
through gddr-ps (scripts/demo-python.sh starts the server and W of these).

    fashion_mnist.py --server tcp://127.0.0.1:5555 --rank 0 --world 4 --epochs 3
    fashion_mnist.py --server tcp://127.0.0.1:5555 --evaluate   # the server's model

Each worker trains on its shard (examples i with i % world == rank); the
server applies the updates, so there is no torch optimizer here: the
server's optimizer is --optimizer's ("adam lr=0.001"; default: its
[optimizer] section, e.g. sgd with momentum), and --lr-schedule step|cosine
drives the server's lr through gddr.torch.ServerOptimizer and a
torch.optim.lr_scheduler (default none: the lr falls linearly to --decay x
as a scale on the gradients). The last line is machine-readable, with the
keys gddr-train uses:
RESULT rank=... test_accuracy=... steps=... bytes_pushed=... ...
With --evaluate nothing is trained: an observer pulls the server's current
parameters and scores them on the test set (RESULT server_model=1 ...).
"""

import argparse
import gzip
import logging
import struct
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Run from a checkout: the package sits in python/ next to this folder.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gddr  # noqa: E402
import gddr.torch  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
MEAN, STD = 0.2860, 0.3530  # of the Fashion-MNIST training pixels


class Net(nn.Module):
    """A LeNet-sized CNN: 28x28 -> conv5 16 -> pool -> conv5 32 -> pool -> 128 -> 10
    (80,202 parameters in 8 tensors)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


# ---- data ---------------------------------------------------------------------


def read_idx(path, magic, ndims):
    """An IDX file (gzip or plain) as a uint8 array."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        raise ValueError("%s: bad magic 0x%08x, want 0x%08x" % (path, got, magic))
    dims = struct.unpack(">%dI" % ndims, data[4:4 + 4 * ndims])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims)
    if body.size != int(np.prod(dims)):
        raise ValueError("%s: %d bytes of data, the header says %s" % (path, body.size, dims))
    return body.reshape(dims)


def find(folder, stem):
    for name in (stem + ".gz", stem):
        p = Path(folder) / name
        if p.exists():
            return p
    raise FileNotFoundError("%s/%s[.gz] is missing (install the Debian package "
                            "dataset-fashion-mnist, or pass --data DIR or --synthetic N)"
                            % (folder, stem))


def load_split(folder, prefix):
    x = read_idx(find(folder, prefix + "-images-idx3-ubyte"), 0x803, 3)
    y = read_idx(find(folder, prefix + "-labels-idx1-ubyte"), 0x801, 1)
    return x, y


def synthetic(n, seed=7):
    """n 28x28 images of 10 classes: a fixed pattern per class plus noise."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 256, size=(10, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=n).astype(np.uint8)
    x = np.clip(centres[y] + rng.normal(0, 60, size=(n, 28, 28)), 0, 255).astype(np.uint8)
    return x, y


def to_tensors(x, y):
    """uint8 images -> normalised float32 NCHW tensor; labels -> int64."""
    xt = torch.from_numpy(((x.astype(np.float32) / 255.0) - MEAN) / STD).unsqueeze(1)
    return xt, torch.from_numpy(y.astype(np.int64))


def test_set(args):
    if args.synthetic:
        return to_tensors(*synthetic(args.synthetic // 4 + 1, seed=8))
    return to_tensors(*load_split(args.data, "t10k"))


def train_shard(args, rank, world):
    """Examples i with i % world == rank, as gddr-train shards them."""
    x, y = synthetic(args.synthetic) if args.synthetic else load_split(args.data, "train")
    return to_tensors(x[rank::world], y[rank::world])


def evaluate(model, x, y, batch=1000):
    """(accuracy, mean cross-entropy) of model on (x, y)."""
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            out = model(x[i:i + batch])
            loss += F.cross_entropy(out, y[i:i + batch], reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(y), loss / len(y)


# ---- the two jobs ------------------------------------------------------------------


def lr_scheduler(args, opt, steps, per_epoch):
    """The torch scheduler of --lr-schedule on a ServerOptimizer, stepped
    once per step; both end at --decay x the starting lr.
    step:   StepLR at every epoch, by decay^(1/(epochs-1)) (3 epochs, decay
            0.1: 1, 0.316, 0.1)
    cosine: CosineAnnealingLR over the run down to eta_min = decay x lr"""
    lr0 = opt.param_groups[0]["lr"]
    if args.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps - 1, 1),
                                                          eta_min=args.decay * lr0)
    epochs = (steps + per_epoch - 1) // per_epoch
    gamma = args.decay ** (1.0 / (epochs - 1)) if epochs > 1 else 1.0
    return torch.optim.lr_scheduler.StepLR(opt, step_size=per_epoch, gamma=gamma)


def client_options(args):
    opts = {}
    for k in ("delay_fraction", "pull_delta_bits", "dc_lambda", "clip_norm", "timeout_ms"):
        v = getattr(args, k)
        if v is not None:
            opts[k] = v
    return opts


def run_evaluate(args):
    """The server's model: pulled by an observer, scored on the test set."""
    xte, yte = test_set(args)
    model = Net()
    with gddr.Client(args.server, rank=0, world_size=1, observer=True, **client_options(args)) as c:
        gddr.torch.ParameterServer(model, c)  # registers (the server's tensors win) and pulls
        version = c.version(0)
    acc, loss = evaluate(model, xte, yte)
    print("RESULT server_model=1 test_accuracy=%.4f test_loss=%.4f version=%d" % (acc, loss, version))


def run_worker(args):
    torch.manual_seed(args.seed)  # the same initial model on every worker
    model = Net()
    t0 = time.monotonic()
    with gddr.Client(args.server, rank=args.rank, world_size=args.world,
                     **client_options(args)) as c:
        rank = c.rank
        xtr, ytr = train_shard(args, rank, c.world_size)
        xte, yte = test_set(args)
        loaded = time.monotonic() - t0
        ps = gddr.torch.ParameterServer(model, c, optimizer=args.optimizer)
        per_epoch = (len(ytr) + args.batch - 1) // args.batch
        steps = args.steps or args.epochs * per_epoch
        opt = sched = None
        if args.lr_schedule != "none":
            opt = gddr.torch.ServerOptimizer(ps)  # starts from the server's lr for the model
            sched = lr_scheduler(args, opt, steps, per_epoch)
        if not args.quiet:
            print("[rank %d] CNN on %s: %d steps, batch %d, %d tensors, %d parameters "
                  "(mode %s, delay_fraction %g, optimizer %s, lr schedule %s, loaded in %.1f s)"
                  % (rank, "synthetic data" if args.synthetic else "Fashion-MNIST", steps,
                     args.batch, len(ps.named), sum(p.numel() for _, p in ps.named), c.mode,
                     args.delay_fraction or 0, ps.optimizer_text,
                     args.lr_schedule if opt else "none (gradients scaled to %g)" % args.decay,
                     loaded), flush=True)
        gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
        order, pos = None, len(ytr)
        loss_ema, t_train, last_print = None, time.monotonic(), time.monotonic()
        for s in range(steps):
            if pos + args.batch > len(ytr):  # a new pass over the shard
                order, pos = torch.randperm(len(ytr), generator=gen), 0
            idx = order[pos:pos + args.batch]
            pos += args.batch
            model.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            if opt is not None:
                opt.step()  # set_lr(the schedule's lr), then ps.step()
                sched.step()
            else:
                if args.decay < 1:
                    # The server applies lr (and momentum) to what it gets:
                    # a gradient scaled by k is a step of lr * k. So the
                    # worker runs the schedule, lr falling linearly to
                    # decay * lr (sgd; Adam's step does not scale with g:
                    # use --lr-schedule there).
                    k = 1.0 - (1.0 - args.decay) * s / steps
                    for _, p in ps.named:
                        if p.grad is not None:
                            p.grad.mul_(k)
                ps.step()
            v = loss.item()
            loss_ema = v if loss_ema is None else 0.98 * loss_ema + 0.02 * v
            now = time.monotonic()
            if not args.quiet and args.progress > 0 and now - last_print >= args.progress:
                print("[rank %d] epoch %.2f step %d/%d loss %.4f  %.0f steps/s"
                      % (rank, (s + 1) / per_epoch, s + 1, steps, loss_ema,
                         (s + 1) / (now - t_train)), flush=True)
                last_print = now
        train_s = time.monotonic() - t_train
        ps.pull()  # the newest parameters the server has
        k, st = c.counters(), c.stats()
        acc, test_loss = evaluate(model, xte, yte)
        print("RESULT rank=%d test_accuracy=%.4f test_loss=%.4f steps=%d bytes_pushed=%d "
              "bytes_pulled=%d values_pushed=%d mean_staleness=%.3f max_staleness=%d "
              "train_seconds=%.2f" % (rank, acc, test_loss, steps, k["bytes_pushed"],
                                      k["bytes_pulled"], k["values_pushed"],
                                      st["worker_staleness_mean"], st["staleness_max"], train_s),
              flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="gddr-ps endpoint")
    ap.add_argument("--rank", type=int, help="worker rank (default: GDDR_RANK, RANK, ...)")
    ap.add_argument("--world", type=int, help="worker count (default: GDDR_WORLD_SIZE, ...)")
    ap.add_argument("--epochs", type=int, default=3, help="passes over this worker's shard")
    ap.add_argument("--steps", type=int, default=0, help="exact number of steps (overrides --epochs)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1, help="model init and data order")
    ap.add_argument("--data", default=DATA, help="Fashion-MNIST folder (default %(default)s)")
    ap.add_argument("--synthetic", type=int, default=0, metavar="N",
                    help="train on N generated images instead (tests)")
    ap.add_argument("--decay", type=float, default=0.1,
                    help="the lr falls to this fraction of its start: with --lr-schedule none "
                    "as a gradient scale from 1 down to this (linear); step, cosine: their end")
    ap.add_argument("--optimizer", metavar="TEXT",
                    help='what the server runs, e.g. "adam lr=0.001" or "sgd lr=0.05 momentum=0.9" '
                    "(kinds sgd, adam, adamw, adagrad; keys lr, momentum, beta1, beta2, betas, eps, "
                    "weight_decay); default: the server's [optimizer] section")
    ap.add_argument("--lr-schedule", choices=("none", "step", "cosine"), default="none",
                    help="step, cosine: torch.optim.lr_scheduler StepLR (every epoch) or "
                    "CosineAnnealingLR driving the server's lr through gddr.torch.ServerOptimizer; "
                    "none (default): the --decay gradient scale")
    ap.add_argument("--delay-fraction", type=float, help="GDDR alpha")
    ap.add_argument("--pull-delta-bits", type=int, choices=(8, 16),
                    help="pulls as 8/16-bit differences from the worker's view")
    ap.add_argument("--dc-lambda", type=float, help="DC-ASGD lambda")
    ap.add_argument("--clip-norm", type=float, help="clip gradients to this global L2 norm")
    ap.add_argument("--timeout-ms", type=int, help="bound on every wait for the server")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--progress", type=float, default=2.0, help="seconds between progress lines")
    ap.add_argument("--quiet", action="store_true", help="only the RESULT line")
    ap.add_argument("--evaluate", action="store_true",
                    help="train nothing: score the server's current model on the test set")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(format="[rank %s] gddr %%(levelname)s: %%(message)s"
                        % (args.rank if args.rank is not None else "?"))
    try:
        run_evaluate(args) if args.evaluate else run_worker(args)
    except (gddr.Error, FileNotFoundError, ValueError) as e:
        print("fashion_mnist.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
