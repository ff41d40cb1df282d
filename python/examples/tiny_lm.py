#!/usr/bin/python3
"""tiny_lm.py -- one worker of a small byte-level transformer language model
trained through gddr-ps with Adam on the server (scripts/experiment-lm.sh
starts the server and W of these).

    gddr-ps --set mode=sync --set workers=4 --set optimizer.kind=adam --set optimizer.lr=0.001 ...
    tiny_lm.py --server tcp://127.0.0.1:5555 --rank 0 --world 4 --steps 250
    tiny_lm.py --server tcp://127.0.0.1:5555 --evaluate   # the server's model

The model: bytes (256 symbols) -> embedding + learned positions -> L
pre-norm blocks of causal multi-head self-attention and a 4x GELU MLP ->
LayerNorm -> logits over the next byte (output weights tied to the
embedding). The defaults (4 layers, d_model 128, 4 heads, context 64)
have 834,304 parameters in 52 tensors. The linear layers go through
oneDNN where torch's own BLAS would be slow (--onednn, class Linear).

The corpus is the Python standard library's own source: every *.py under
/usr/lib/python3.11 outside test/ and tests/ folders (and outside
dist-packages, site-packages and config-* folders, which other packages
fill). Debian's libpython3.11-minimal and libpython3.11-stdlib install it,
so it is on every Debian (bookworm) with python3; no download. About 640
files, 11 MB of code, comments and docstrings: real text with long-range
structure (indentation, names defined and used again), where a bigram model
stops near 2.5 nats per byte and a transformer has something to learn.

The split is by file and deterministic: of the files in sorted order, those
whose index % 20 == 0 are held out, the others train. Worker r of W trains
on the training files with training index % W == r and samples random
windows (context + 1 bytes) from their concatenation, with a generator
seeded by (seed, rank). There is no torch optimizer: the server runs Adam
(optimizer.kind=adam; Adam's step counter is the tensor's version).

With --lockstep W one process runs all W workers, stepped in turn: in
async mode every push is then exactly W-1 versions stale and a run repeats
to the last digit, so two settings can be compared without the machine's
load deciding the staleness (scripts/experiment-lm.sh --lockstep).

The last line is machine-readable: RESULT rank=... train_loss=... steps=...
bytes_pushed=... bytes_pulled=... train_seconds=... With --evaluate
nothing is trained: an observer pulls the server's current parameters and
reports the mean cross-entropy per byte on a fixed set of held-out windows
(--eval-windows, seed 12345), in nats and in bits per byte
(RESULT server_model=1 heldout_loss=... bits_per_byte=... version=...).
"""

import argparse
import logging
import math
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

CORPUS = "/usr/lib/python3.11"  # Debian's libpython3.11-minimal + libpython3.11-stdlib
HOLD_OUT_EVERY = 20  # files whose sorted index % 20 == 0 are held out
EVAL_SEED = 12345  # the held-out windows are the same for every run


# ---- the model ------------------------------------------------------------------


def _onednn(x, w, b=None):
    """x @ w.T + b through oneDNN's inner product (2-D dense in and out)."""
    return torch._C._nn.mkldnn_linear(x.to_mkldnn(), w.to_mkldnn(),
                                      None if b is None else b.to_mkldnn()).to_dense()


class _OneDNNLinear(torch.autograd.Function):
    """A linear layer whose three products (forward, input and weight
    gradients) go through oneDNN instead of torch's BLAS."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return _onednn(x, w, b)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        gy = gy.contiguous()
        gx = _onednn(gy, w.t().contiguous())  # gy @ w
        gw = _onednn(gy.t().contiguous(), x.t().contiguous())  # gy.T @ x
        return gx, gw, gy.sum(0) if ctx.needs_input_grad[2] else None


class Linear(nn.Linear):
    """nn.Linear (same parameters, same names), computed through oneDNN when
    Linear.onednn is set. Debian's python3-torch does its dense products
    through libblas3, which is the reference BLAS unless an optimised one
    is installed: about 3 GFLOP/s a core, and this model's steps 5-7x
    slower than with oneDNN's kernels (which that torch also carries)."""

    onednn = False

    def forward(self, x):
        return linear(x, self.weight, self.bias)


def linear(x, w, b=None):
    """F.linear(x, w, b), through oneDNN when Linear.onednn is set."""
    if not Linear.onednn:
        return F.linear(x, w, b)
    shape = x.shape
    y = _OneDNNLinear.apply(x.reshape(-1, shape[-1]).contiguous(), w, b)
    return y.view(*shape[:-1], y.shape[-1])


def use_onednn(choice):
    """--onednn auto: on unless torch does its products with MKL."""
    if choice == "auto":
        on = torch.backends.mkldnn.is_available() and "BLAS_INFO=mkl" not in torch.__config__.show()
    else:
        on = choice == "on"
    Linear.onednn = on
    return on


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d, heads, context):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = Linear(d, 3 * d)
        self.proj = Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = Linear(d, 4 * d)
        self.out = Linear(4 * d, d)
        mask = torch.full((context, context), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(d // h)) + self.mask[:t, :t]
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """A byte-level GPT: 256 symbols, learned positions, tied output."""

    def __init__(self, layers=4, d=128, heads=4, context=128):
        super().__init__()
        self.context = context
        self.emb = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(context, d))
        self.blocks = nn.ModuleList(Block(d, heads, context) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        nn.init.normal_(self.emb.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.01)
        for blk in self.blocks:
            for lin in (blk.qkv, blk.proj, blk.fc, blk.out):
                nn.init.normal_(lin.weight, std=0.02)
                nn.init.zeros_(lin.bias)
            # GPT-2's scaling of the residual projections by depth
            for lin in (blk.proj, blk.out):
                lin.weight.data.mul_(1.0 / math.sqrt(2 * layers))

    def forward(self, idx):
        x = self.emb(idx) + self.pos[:idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return linear(self.ln(x), self.emb.weight)


def lm_loss(model, batch):
    """Mean cross-entropy (nats) of predicting batch[:, 1:] from batch[:, :-1]."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))


# ---- data ---------------------------------------------------------------------


def corpus_files(root):
    """The corpus files in sorted order (the split depends on this order)."""
    root = Path(root)
    skip = {"test", "tests", "dist-packages", "site-packages", "__pycache__"}
    files = []
    for p in root.rglob("*.py"):
        parts = p.relative_to(root).parts[:-1]
        if skip & set(parts) or any(s.startswith("config-") for s in parts):
            continue
        files.append(p)
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise FileNotFoundError("%s has no *.py files (install the Debian packages "
                                "libpython3.11-minimal and libpython3.11-stdlib, or pass "
                                "--corpus DIR or --synthetic N)" % root)
    return files


def read_bytes(files):
    return np.frombuffer(b"".join(p.read_bytes() for p in files), dtype=np.uint8)


def synthetic_text(n, seed):
    """n bytes of generated 'code': lines of words from a small vocabulary,
    with indentation and a few fixed phrases (learnable, for smoke tests)."""
    rng = np.random.default_rng(seed)
    words = ["def", "return", "self", "import", "for", "in", "if", "else:", "x", "y",
             "None", "True", "value", "name", "(", ")", "=", "+", "1", "0"]
    out, size = [], 0
    while size < n:
        line = "    " * int(rng.integers(0, 3)) + " ".join(
            words[i] for i in rng.integers(0, len(words), int(rng.integers(2, 8)))) + "\n"
        out.append(line)
        size += len(line)
    return np.frombuffer("".join(out).encode()[:n], dtype=np.uint8)


def train_text(args, rank, world):
    """This worker's training bytes: its shard of the training files."""
    if args.synthetic:
        return synthetic_text(args.synthetic, seed=1000 + rank)
    files = corpus_files(args.corpus)
    train = [p for i, p in enumerate(files) if i % HOLD_OUT_EVERY != 0]
    return read_bytes(train[rank::world])


def heldout_windows(args):
    """The fixed evaluation set: --eval-windows windows of context + 1 bytes
    from the held-out files (seed EVAL_SEED), as an int64 tensor."""
    if args.synthetic:
        text = synthetic_text(max(args.synthetic // 4, 4 * (args.context + 1)), seed=999)
    else:
        files = corpus_files(args.corpus)
        text = read_bytes([p for i, p in enumerate(files) if i % HOLD_OUT_EVERY == 0])
    rng = np.random.default_rng(EVAL_SEED)
    starts = rng.integers(0, len(text) - args.context - 1, args.eval_windows)
    return torch.from_numpy(np.stack([text[s:s + args.context + 1] for s in starts]).astype(np.int64))


def sample(text, gen, batch, context):
    starts = torch.randint(0, len(text) - context - 1, (batch,), generator=gen).numpy()
    return torch.from_numpy(np.stack([text[s:s + context + 1] for s in starts]).astype(np.int64))


def evaluate(model, windows, batch=64):
    """Mean cross-entropy per predicted byte, in nats."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            w = windows[i:i + batch]
            total += lm_loss(model, w).item() * len(w)
    model.train()
    return total / len(windows)


def make_model(args):
    return TinyLM(args.layers, args.d_model, args.heads, args.context)


# ---- the two jobs ------------------------------------------------------------------


def client_options(args):
    opts = {}
    for k in ("delay_fraction", "pull_delta_bits", "hold_schedule", "clip_norm", "timeout_ms"):
        v = getattr(args, k)
        if v is not None:
            opts[k] = v
    return opts


def run_evaluate(args):
    """The server's model: pulled by an observer, scored on the held-out windows."""
    windows = heldout_windows(args)
    model = make_model(args)
    with gddr.Client(args.server, rank=0, world_size=1, observer=True, **client_options(args)) as c:
        gddr.torch.ParameterServer(model, c)  # registers (the server's tensors win) and pulls
        version = c.version(0)
    loss = evaluate(model, windows)
    print("RESULT server_model=1 heldout_loss=%.4f bits_per_byte=%.4f windows=%d version=%d"
          % (loss, loss / math.log(2), len(windows), version))


def print_result(rank, loss_ema, steps, c, train_s, extra=""):
    """A worker's machine-readable last line."""
    k, st = c.counters(), c.stats()
    print("RESULT rank=%d train_loss=%.4f steps=%d bytes_pushed=%d bytes_pulled=%d "
          "values_pushed=%d mean_staleness=%.3f max_staleness=%d train_seconds=%.2f%s"
          % (rank, loss_ema if loss_ema is not None else float("nan"), steps,
             k["bytes_pushed"], k["bytes_pulled"], k["values_pushed"],
             st["worker_staleness_mean"], st["staleness_max"], train_s, extra), flush=True)


def run_worker(args):
    torch.manual_seed(args.seed)  # the same initial model on every worker
    model = make_model(args)
    t0 = time.monotonic()
    with gddr.Client(args.server, rank=args.rank, world_size=args.world,
                     **client_options(args)) as c:
        rank = c.rank
        text = train_text(args, rank, c.world_size)
        loaded = time.monotonic() - t0
        ps = gddr.torch.ParameterServer(model, c)
        if not args.quiet:
            print("[rank %d] byte LM on %s (%.1f MB): %d steps, batch %d x %d bytes, %d tensors, "
                  "%d parameters (mode %s, delay_fraction %g, loaded in %.1f s)"
                  % (rank, "synthetic text" if args.synthetic else args.corpus, len(text) / 1e6,
                     args.steps, args.batch, args.context, len(ps.named),
                     sum(p.numel() for _, p in ps.named), c.mode, args.delay_fraction or 0,
                     loaded), flush=True)
        gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
        loss_ema, t_train, last_print = None, time.monotonic(), time.monotonic()
        for s in range(args.steps):
            model.zero_grad(set_to_none=False)
            loss = lm_loss(model, sample(text, gen, args.batch, args.context))
            loss.backward()
            ps.step()
            v = loss.item()
            loss_ema = v if loss_ema is None else 0.95 * loss_ema + 0.05 * v
            now = time.monotonic()
            if not args.quiet and args.progress > 0 and now - last_print >= args.progress:
                print("[rank %d] step %d/%d loss %.4f  %.2f steps/s"
                      % (rank, s + 1, args.steps, loss_ema, (s + 1) / (now - t_train)), flush=True)
                last_print = now
        train_s = time.monotonic() - t_train
        view = ""
        if args.eval_view and rank == 0:
            # This worker's own view before its close (the flush of its
            # residual comes after): what the server's final model is
            # compared against to see what the close costs.
            view = " view_loss=%.4f" % evaluate(model, heldout_windows(args))
        print_result(rank, loss_ema, args.steps, c, train_s, view)


def run_lockstep(args):
    """W workers in this one process, stepped in turn (rank 0, 1, ..., W-1,
    0, ...), each gddr_step a push and a pull. Against an async server every
    push is then exactly W-1 versions stale, and the run repeats to the
    last digit: the order of pushes, the staleness and every hold are the
    same each time (one torch thread, one process). What a run of W
    processes leaves to the machine's load -- when a worker pushes, so its
    staleness -- is fixed here, so GDDR and dense can be compared seed by
    seed without the async draw (docs/results-lm.md, "Async in lockstep")."""
    world = args.lockstep
    run = []  # (rank, model, client, ParameterServer, text, generator)
    try:
        for r in range(world):
            torch.manual_seed(args.seed)  # the same initial model on every worker
            model = make_model(args)
            c = gddr.Client(args.server, rank=r, world_size=world, **client_options(args))
            run.append((r, model, c))  # closed below whatever happens next
            run[-1] += (gddr.torch.ParameterServer(model, c), train_text(args, r, world),
                        torch.Generator().manual_seed(args.seed * 1000 + r))
        if not args.quiet:
            print("[lockstep] %d workers in turn, %d steps each, mode %s, delay_fraction %g"
                  % (world, args.steps, run[0][2].mode, args.delay_fraction or 0), flush=True)
        ema = [None] * world
        t_train, last_print = time.monotonic(), time.monotonic()
        for s in range(args.steps):
            for r, model, c, ps, text, gen in run:
                model.zero_grad(set_to_none=False)
                loss = lm_loss(model, sample(text, gen, args.batch, args.context))
                loss.backward()
                ps.step()
                v = loss.item()
                ema[r] = v if ema[r] is None else 0.95 * ema[r] + 0.05 * v
            now = time.monotonic()
            if not args.quiet and args.progress > 0 and now - last_print >= args.progress:
                print("[lockstep] step %d/%d loss %.4f  %.2f steps/s"
                      % (s + 1, args.steps, sum(ema) / world, (s + 1) / (now - t_train)), flush=True)
                last_print = now
        train_s = time.monotonic() - t_train
        for r, model, c, ps, text, gen in run:
            print_result(r, ema[r], args.steps, c, train_s)
    finally:
        # Closed in rank order: each close flushes its worker's residual.
        for w in run:
            w[2].close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="gddr-ps endpoint")
    ap.add_argument("--rank", type=int, help="worker rank (default: GDDR_RANK, RANK, ...)")
    ap.add_argument("--world", type=int, help="worker count (default: GDDR_WORLD_SIZE, ...)")
    ap.add_argument("--steps", type=int, default=250, help="steps of this worker")
    ap.add_argument("--batch", type=int, default=16, help="windows per step")
    ap.add_argument("--context", type=int, default=64, help="bytes a window predicts")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1, help="model init and window sampling")
    ap.add_argument("--corpus", default=CORPUS, help="folder of *.py files (default %(default)s)")
    ap.add_argument("--synthetic", type=int, default=0, metavar="N",
                    help="train on N bytes of generated text instead (tests)")
    ap.add_argument("--eval-windows", type=int, default=256,
                    help="held-out windows the observer scores (default %(default)s)")
    ap.add_argument("--delay-fraction", type=float, help="GDDR alpha")
    ap.add_argument("--pull-delta-bits", type=int, choices=(8, 16),
                    help="pulls as 8/16-bit differences from the worker's view")
    ap.add_argument("--hold-schedule", choices=("auto", "random", "staggered", "smallest"),
                    help="which chunks GDDR holds (client option hold_schedule; default auto: "
                         "staggered in sync mode, smallest in async)")
    ap.add_argument("--clip-norm", type=float, help="clip gradients to this global L2 norm")
    ap.add_argument("--timeout-ms", type=int, help="bound on every wait for the server")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--onednn", choices=("auto", "on", "off"), default="auto",
                    help="the linear layers through oneDNN (auto: unless torch uses MKL)")
    ap.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    ap.add_argument("--quiet", action="store_true", help="only the RESULT line")
    ap.add_argument("--eval-view", action="store_true",
                    help="rank 0 also scores its own view on the held-out windows before it closes")
    ap.add_argument("--lockstep", type=int, metavar="W",
                    help="run W workers in this process, stepped in turn (async: staleness W-1, "
                         "reproducible runs); --rank and --world are then ignored")
    ap.add_argument("--evaluate", action="store_true",
                    help="train nothing: score the server's current model on the held-out windows")
    args = ap.parse_args(argv)
    if args.lockstep is not None and args.lockstep < 1:
        ap.error("--lockstep needs at least 1 worker")
    torch.set_num_threads(args.threads)
    use_onednn(args.onednn)
    logging.basicConfig(format="[rank %s] gddr %%(levelname)s: %%(message)s"
                        % (args.rank if args.rank is not None else "?"))
    try:
        if args.evaluate:
            run_evaluate(args)
        elif args.lockstep is not None:
            run_lockstep(args)
        else:
            run_worker(args)
    except (gddr.Error, FileNotFoundError, ValueError) as e:
        print("tiny_lm.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
