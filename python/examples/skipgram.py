#!/usr/bin/python3
"""skipgram.py -- word embeddings by skip-gram with negative sampling
(word2vec), trained by W worker processes through gddr-ps sparse tables.

    skipgram.py --workers 4 --steps 1500                 # the real corpus, 4 workers
    skipgram.py --workers 1 --steps 6000                 # the same pairs, one worker
    skipgram.py --synthetic 60000 --workers 2 --steps 80 --dim 16   # seconds (tests)
    skipgram.py --servers 3 ...                          # rows sharded over 3 gddr-ps

This script is the launcher: it tokenises the corpus once (into --workdir),
starts --servers gddr-ps ($GDDR_BIN/gddr-ps, else the checkout's
build/bin, else PATH; several: shard_index/shard_count, rows split by key),
starts --workers copies of itself as workers (--worker RANK), waits for them
to leave, then scores the model the SERVERS keep, read by an observer
(inference pulls: nothing is created), and stops the servers.

The corpus is the Python standard library's sources (Debian's
libpython3.11-minimal and -stdlib install them: no download), the files of
tiny_lm.py: every *.py under /usr/lib/python3.11 outside test(s)/ and
site/dist-packages. Tokens are identifiers and words,
re.findall(r"[A-Za-z_][A-Za-z0-9_]*"), lowercased; the vocabulary is the
--vocab most frequent tokens of the training files (others are dropped).
Files whose sorted index % 20 == 0 are held out; worker r of W trains on
the training files with index % W == r. Frequent tokens are subsampled as
in word2vec (kept with probability sqrt(t/f) + t/f, t = --subsample), once
per worker with its own seed. A token's key is the first 8 bytes of its
BLAKE2b hash as int64 (so about half the keys are negative ids: the
Embedding reinterprets them as uint64, same bits).

The model: two tables of --dim floats a row on the server, "sg.in" (the
word vectors, U(-0.5/dim, 0.5/dim) as word2vec starts them) and "sg.out"
(the context vectors, zeros), both stepped by the server's --optimizer
(default Adagrad, lr 0.1: a per-row step size that shrinks with the
row's own gradient history, so the few very frequent tokens do not need
word2vec's decaying global lr, and rows touched rarely still move; plain
SGD at a fixed lr either crawls on rare rows or overshoots on frequent
ones). Each step a worker samples --batch (center, context) pairs from its
stream (word2vec's dynamic window: a distance d <= b <= --window, both
uniform), --negatives negatives per pair from the unigram^0.75
distribution, and runs two gddr.torch.Embedding lookups: forward pulls the
rows the batch uses, loss.backward() pushes their summed gradients (the
loss is summed over pairs, word2vec's per-pair gradient). In sync mode the
server averages a step's pushes over the workers.

Quality: the held-out loss is the mean negative-sampling loss,
-log s(u_o.v_c) - sum_k log s(-u_k.v_c), over --eval-pairs pairs drawn
from the held-out files with fixed negatives (seed 12345, the same in every
run). Its initial value is (1 + K) ln 2 (the out rows start at zero). Then
the nearest neighbours (cosine of the in vectors among the 10,000 most
frequent tokens) of a few tokens. With --synthetic N, the corpus is N
generated tokens of 40 topics of 25 words each (80% topic words, 20%
common words); topic_precision is the fraction of the 5 nearest
neighbours of the topic words that share their topic.

The last line is machine-readable: RESULT workers=... servers=... mode=...
pairs=... initial_loss=... heldout_loss=... train_seconds=... wall_seconds=...
"""

import argparse
import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))  # the package, from a checkout

CORPUS = "/usr/lib/python3.11"
HOLD_OUT_EVERY = 20
EVAL_SEED = 12345
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
QUERIES = ["append", "self", "true", "error", "socket", "thread", "read"]
NN_VOCAB = 10000
WAIT_S = 60.0  # bound on a server's start and stop


# ---- data (the launcher prepares it once) -------------------------------------------


def corpus_files(root):
    """tiny_lm.py's corpus: the *.py files in sorted order."""
    root = Path(root)
    skip = {"test", "tests", "dist-packages", "site-packages", "__pycache__"}
    files = [p for p in root.rglob("*.py")
             if not skip & set(p.relative_to(root).parts[:-1])
             and not any(s.startswith("config-") for s in p.relative_to(root).parts[:-1])]
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise FileNotFoundError("%s has no *.py files (install libpython3.11-stdlib, or pass "
                                "--corpus DIR or --synthetic N)" % root)
    return files


def tokens_of(files):
    out = []
    for p in files:
        out += [t.lower() for t in TOKEN.findall(p.read_text(errors="replace"))]
    return out


def synthetic_tokens(n, seed, topics=40, per_topic=25, common=50):
    """n tokens of documents of 50: each document draws a topic; a token
    is one of its topic's words (80%) or a common word (20%, Zipf-like)."""
    rng = np.random.default_rng(seed)
    cw = 1.0 / np.arange(1, common + 1)
    cw /= cw.sum()
    out = []
    while len(out) < n:
        t = int(rng.integers(topics))
        is_topic = rng.random(50) < 0.8
        tw = rng.integers(per_topic, size=50)
        cc = rng.choice(common, size=50, p=cw)
        out += ["t%dw%d" % (t, w) if it else "c%d" % c for it, w, c in zip(is_topic, tw, cc)]
    return out[:n]


def key_of(token):
    """A token's 64-bit key: BLAKE2b's first 8 bytes, as int64."""
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little",
                          signed=True)


def subsample(ids, counts, t, rng):
    """word2vec's subsampling of frequent tokens (ids: vocabulary indices)."""
    f = counts / counts.sum()
    keep = np.minimum(1.0, np.sqrt(t / f) + t / f)
    return ids[rng.random(len(ids)) < keep[ids]]


def sample_pairs(stream, n, window, rng):
    """n (center, context) pairs of vocabulary indices, word2vec's dynamic
    window: b uniform in 1..window, the distance d uniform in 1..b."""
    pos = rng.integers(window, len(stream) - window, n)
    b = rng.integers(1, window + 1, n)
    d = (rng.random(n) * b).astype(np.int64) + 1
    sign = np.where(rng.random(n) < 0.5, -1, 1)
    return stream[pos], stream[pos + sign * d]


def prepare(args, workdir):
    """Vocabulary, keys, each worker's token stream and the held-out set,
    written under workdir as .npy files (and meta.json)."""
    W = args.workers
    if args.synthetic:
        train_tok = [synthetic_tokens(args.synthetic // W, seed=1000 + r) for r in range(W)]
        held_tok = synthetic_tokens(max(args.synthetic // 4, 5000), seed=999)
    else:
        files = corpus_files(args.corpus)
        train = [p for i, p in enumerate(files) if i % HOLD_OUT_EVERY != 0]
        train_tok = [tokens_of(train[r::W]) for r in range(W)]
        held_tok = tokens_of([p for i, p in enumerate(files) if i % HOLD_OUT_EVERY == 0])
    counts = Counter()
    for toks in train_tok:
        counts.update(toks)
    vocab = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:args.vocab]]
    index = {w: i for i, w in enumerate(vocab)}
    cnt = np.array([counts[w] for w in vocab], dtype=np.float64)
    np.save(workdir / "counts.npy", cnt)
    np.save(workdir / "keys.npy", np.array([key_of(w) for w in vocab], dtype=np.int64))
    (workdir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    total = 0
    for r, toks in enumerate(train_tok):
        ids = np.array([index[t] for t in toks if t in index], dtype=np.int32)
        total += len(ids)
        np.save(workdir / ("train%d.npy" % r), ids)
    rng = np.random.default_rng(EVAL_SEED)
    held = subsample(np.array([index[t] for t in held_tok if t in index], dtype=np.int64), cnt,
                     args.subsample, rng)
    c, o = sample_pairs(held, args.eval_pairs, args.window, rng)
    neg = negatives(cnt, (args.eval_pairs, args.negatives), rng)
    np.savez(workdir / "heldout.npz", center=c, context=o, neg=neg)
    meta = {"vocab": len(vocab), "train_tokens": total, "heldout_tokens": len(held),
            "corpus": "synthetic %d" % args.synthetic if args.synthetic else str(args.corpus)}
    (workdir / "meta.json").write_text(json.dumps(meta))
    return meta


def negatives(counts, shape, rng):
    """Vocabulary indices drawn from the unigram distribution to the 0.75."""
    p = counts ** 0.75
    cdf = np.cumsum(p / p.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(shape)), len(counts) - 1)


# ---- a worker ---------------------------------------------------------------------


def table_kw(args):
    opt = "%s lr=%g" % (args.optimizer, args.lr)
    return ({"init": "uniform", "init_scale": 0.5 / args.dim, "init_seed": args.seed,
             "optimizer": opt},
            {"init": "zeros", "optimizer": opt})


def run_worker(args):
    import torch
    import torch.nn.functional as F
    import gddr
    import gddr.torch

    torch.set_num_threads(1)
    wd, r = Path(args.workdir), args.worker
    keys = torch.from_numpy(np.load(wd / "keys.npy"))
    counts = np.load(wd / "counts.npy")
    stream = np.load(wd / ("train%d.npy" % r)).astype(np.int64)
    rng = np.random.default_rng(args.seed * 1000 + r)
    stream = subsample(stream, counts, args.subsample, rng)
    if len(stream) <= 2 * args.window + 1:
        raise ValueError("worker %d has %d tokens after subsampling: too few" % (r, len(stream)))
    kin, kout = table_kw(args)
    K = args.negatives
    sign = torch.cat([torch.ones(1), -torch.ones(K)])  # +1 for the context, -1 for negatives
    t0 = time.monotonic()
    loss_sum, n_loss = 0.0, 0
    with gddr.Client(args.server, rank=r, world_size=args.workers, timeout_ms=120000) as c:
        emb_in = gddr.torch.Embedding(c, "sg.in", args.dim, **kin)
        emb_out = gddr.torch.Embedding(c, "sg.out", args.dim, **kout)
        for s in range(args.steps):
            center, context = sample_pairs(stream, args.batch, args.window, rng)
            neg = negatives(counts, (args.batch, K), rng)
            ids_c = keys[torch.from_numpy(center)]
            ids_o = keys[torch.from_numpy(np.concatenate([context[:, None], neg], 1))]
            v = emb_in(ids_c)                                   # (B, dim)
            u = emb_out(ids_o)                                  # (B, 1 + K, dim)
            scores = torch.bmm(u, v.unsqueeze(2)).squeeze(2)    # (B, 1 + K)
            loss = -F.logsigmoid(scores * sign).sum()
            loss.backward()                                     # pushes both tables
            emb_in.step()
            emb_out.step()
            loss_sum += loss.item()
            n_loss += args.batch
            if not args.quiet and r == 0 and (s + 1) % max(1, args.steps // 5) == 0:
                print("[rank 0] step %d/%d  train loss %.4f a pair  (%.1f s)"
                      % (s + 1, args.steps, loss_sum / n_loss, time.monotonic() - t0), flush=True)
                loss_sum, n_loss = 0.0, 0
        k = c.counters()
    print("WORKER rank=%d steps=%d pairs=%d tokens=%d bytes_pushed=%d "
          "seconds=%.2f" % (r, args.steps, args.steps * args.batch, len(stream),
                            k["bytes_pushed"], time.monotonic() - t0),
          flush=True)


# ---- the server's model ---------------------------------------------------------------


def heldout_loss(vin, vout):
    """Mean negative-sampling loss of the held-out pairs; vin (P, d) the
    centers' rows, vout (P, 1 + K, d) the context's then the negatives'."""
    s = np.einsum("pkd,pd->pk", vout.astype(np.float64), vin.astype(np.float64))
    s[:, 1:] *= -1
    return float(np.mean(np.sum(np.logaddexp(0.0, -s), axis=1)))


def score_server(args, endpoint, workdir):
    """The servers' final model, read by an observer: the held-out loss and
    the nearest neighbours."""
    import gddr

    keys = np.load(workdir / "keys.npy")
    vocab = (workdir / "vocab.txt").read_text().split("\n")[:len(keys)]
    h = np.load(workdir / "heldout.npz")
    with gddr.Client(endpoint, rank=0, world_size=1, observer=True, timeout_ms=60000) as c:
        t_in = c.register_table("sg.in", args.dim)
        t_out = c.register_table("sg.out", args.dim)
        vin = t_in.pull(keys[h["center"]], create=False)
        vout = t_out.pull(keys[np.concatenate([h["context"][:, None], h["neg"]], 1)].reshape(-1),
                          create=False).reshape(len(h["center"]), -1, args.dim)
        m = min(NN_VOCAB, len(keys))
        top = t_in.pull(keys[:m], create=False)
        version = t_in.version
    result = {"heldout_loss": heldout_loss(vin, vout), "version": version}
    norm = top / np.maximum(np.linalg.norm(top, axis=1, keepdims=True), 1e-12)
    index = {w: i for i, w in enumerate(vocab[:m])}
    if args.synthetic:
        queries = [w for w in vocab[:m] if w.startswith("t")]
    else:
        queries = [w for w in QUERIES if w in index]
    neighbours, hits, total = {}, 0, 0
    for w in queries:
        sim = norm @ norm[index[w]]
        sim[index[w]] = -2
        best = np.argsort(-sim)[:8]
        neighbours[w] = [(vocab[j], float(sim[j])) for j in best]
        if args.synthetic:
            topic = w.split("w")[0]
            hits += sum(vocab[j].split("w")[0] == topic for j in best[:5])
            total += 5
    result["neighbours"] = neighbours
    if args.synthetic:
        result["topic_precision"] = hits / max(total, 1)
    return result


# ---- the launcher ------------------------------------------------------------------


def gddr_ps():
    env = os.environ.get("GDDR_BIN")
    if env:
        d = Path(env)
        d = d if d.is_absolute() else HERE.parents[2] / d
        return str(d / "gddr-ps")
    built = HERE.parents[2] / "build" / "bin" / "gddr-ps"
    if built.exists():
        return str(built)
    found = shutil.which("gddr-ps")
    if not found:
        raise FileNotFoundError("gddr-ps not found (set GDDR_BIN, build with make, or install it)")
    return found


def start_servers(args, workdir):
    procs, eps = [], []
    for i in range(args.servers):
        d = workdir / ("ps%d" % i)
        d.mkdir(exist_ok=True)
        ep_file = d / "endpoint"
        argv = [gddr_ps(), "--listen", "tcp://127.0.0.1:*", "--endpoint-file", str(ep_file),
                "--set", "mode=%s" % args.mode, "--set", "workers=%d" % args.workers,
                "--set", "worker_timeout_s=600"]
        if args.servers > 1:
            argv += ["--set", "shard_index=%d" % i, "--set", "shard_count=%d" % args.servers]
        log = open(d / "gddr-ps.log", "wb")
        procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=str(d)))
        deadline = time.monotonic() + WAIT_S
        while not (ep_file.exists() and ep_file.read_text().strip()):
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("gddr-ps %d did not start: see %s" % (i, d / "gddr-ps.log"))
            time.sleep(0.02)
        eps.append(ep_file.read_text().strip())
    return procs, ", ".join(eps)


def stop(procs):
    """SIGTERM, a bounded wait, SIGKILL; the exit statuses."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=WAIT_S))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(p.wait())
    return rcs


def worker_argv(args, rank, endpoint, workdir):
    argv = [sys.executable, str(HERE), "--worker", str(rank), "--server", endpoint,
            "--workdir", str(workdir)]
    for k in ("workers", "steps", "batch", "negatives", "window", "dim", "subsample", "seed",
              "lr", "optimizer", "synthetic"):
        argv += ["--" + k, str(getattr(args, k))]
    return argv + (["--quiet"] if args.quiet else [])


def launch(args):
    t_start = time.monotonic()
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="skipgram.") if own else args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    procs, workers = [], []
    try:
        meta = prepare(args, workdir)
        print("skip-gram: %s, vocabulary %d, %d training tokens over %d workers, %d held-out "
              "pairs; %d steps x %d pairs x %d negatives a worker, dim %d, %s lr %g, mode %s, "
              "%d server(s)" % (meta["corpus"], meta["vocab"], meta["train_tokens"],
                                args.workers, args.eval_pairs, args.steps, args.batch,
                                args.negatives, args.dim, args.optimizer, args.lr, args.mode,
                                args.servers), flush=True)
        procs, endpoint = start_servers(args, workdir)
        t_train = time.monotonic()
        workers = [subprocess.Popen(worker_argv(args, r, endpoint, workdir))
                   for r in range(args.workers)]
        deadline = time.monotonic() + args.timeout
        for r, w in enumerate(workers):
            rc = w.wait(timeout=max(1.0, deadline - time.monotonic()))
            if rc != 0:
                raise RuntimeError("worker %d exited with %d" % (r, rc))
        train_s = time.monotonic() - t_train
        res = score_server(args, endpoint, workdir)
        bad = [rc for rc in stop(procs) if rc != 0]
        procs = []
        if bad:
            raise RuntimeError("gddr-ps exited with %s (logs in %s)" % (bad, workdir))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        stop(procs)
        if own and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    initial = (1 + args.negatives) * math.log(2)
    if not args.quiet:
        for w, nn in res["neighbours"].items():
            if args.synthetic and w not in ("t%dw0" % i for i in range(6)):
                continue
            print("  %-10s %s" % (w, "  ".join("%s %.2f" % (n, s) for n, s in nn)))
    extra = " topic_precision=%.3f" % res["topic_precision"] if args.synthetic else ""
    print("RESULT workers=%d servers=%d mode=%s pairs=%d initial_loss=%.4f heldout_loss=%.4f "
          "version=%d train_seconds=%.1f wall_seconds=%.1f%s"
          % (args.workers, args.servers, args.mode, args.workers * args.steps * args.batch,
             initial, res["heldout_loss"], res["version"], train_s,
             time.monotonic() - t_start, extra), flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    ap.add_argument("--servers", type=int, default=1, help="gddr-ps, rows sharded by key")
    ap.add_argument("--mode", choices=("async", "sync"), default="async")
    ap.add_argument("--steps", type=int, default=1500, help="steps of each worker")
    ap.add_argument("--batch", type=int, default=512, help="(center, context) pairs a step")
    ap.add_argument("--negatives", type=int, default=5, help="negatives a pair (K)")
    ap.add_argument("--window", type=int, default=5, help="largest context distance")
    ap.add_argument("--dim", type=int, default=64, help="embedding size")
    ap.add_argument("--vocab", type=int, default=30000, help="most frequent tokens kept")
    ap.add_argument("--subsample", type=float, default=1e-4, help="word2vec's t")
    ap.add_argument("--optimizer", choices=("adagrad", "sgd", "adam"), default="adagrad")
    ap.add_argument("--lr", type=float, default=0.1, help="the server's lr for both tables")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-pairs", type=int, default=20000, help="held-out pairs")
    ap.add_argument("--corpus", default=CORPUS, help="folder of *.py files (default %(default)s)")
    ap.add_argument("--synthetic", type=int, default=0, metavar="N",
                    help="N generated tokens of topics instead of the corpus (tests)")
    ap.add_argument("--workdir", help="where the prepared data and logs go (default: a "
                    "temporary folder, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--timeout", type=float, default=3600, help="bound on the training, seconds")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)   # internal: a worker's rank
    ap.add_argument("--server", help=argparse.SUPPRESS)             # internal: the endpoints
    args = ap.parse_args(argv)
    logging.basicConfig(format="skipgram %(levelname)s: %(message)s")
    if args.worker is not None:
        run_worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
