#!/usr/bin/python3
"""momsim.py -- a numpy model of gddr-ps in sync mode with GDDR workers and server momentum,
for trying an idea in seconds before building it in C (docs/design-decisions.md, "Held chunks
are filled").

4 workers, MLP 784-H-10 on Fashion-MNIST (Debian's dataset-fashion-mnist), batch 128 per worker,
float32, GDDR's random chunk holds (alpha, tau, chunk 1024), and the test accuracy of the model
the *server* ends with, after the workers' residuals came in.

    scripts/momsim.py KINDS [SEEDS]      e.g. scripts/momsim.py dense,server,fill 1,2,3
    environment: H (1280), STEPS (300), LR (0.1), MU (0.9), ALPHA (0.4), TAU (4),
                 END = join (default) | coast | none

Kinds:
  dense   server heavy-ball momentum, every chunk sent every step
  server  GDDR: a held chunk's residual (raw gradients) arrives when sent; momentum on the server
  fill    GDDR with fill (server/fill.c): a chunk's mean is taken over the workers that sent it,
          credited to those that held it, and the credit is taken off when they send it
  dgc     DGC's momentum correction: velocity u = mu*u + g on each worker, released through the
          residual, u cleared where sent (factor masking); the server applies plain SGD
End of training (END), for the GDDR kinds:
  join    every residual is added to the last step (v += lr*r/N, w -= lr*r/N): what gddr-ps does
  coast   tau+1 steps of zero gradient release the residual on its schedule; momentum coasts
  none    the residual is dropped

Measured on 2 cores, H=256 (about 35 s a run), server's final model:
  seed 1, momentum 0.9:  dense 0.8552; server 0.7681 (join); fill 0.8564 (join), 0.8550 (none),
                         0.8000 (coast); dgc 0.7915 (coast), 0.8093 (join)
  seeds 2, 3:            dense 0.8541 0.8500; fill 0.8558 0.8516 (join)
  seed 1, mu 0, lr 0.2:  dense 0.8296; server 0.8067; fill 0.8233 (join)
"""
import os
import sys

import numpy as np

from simmlp import MLP, XTR, YTR

E = os.environ.get


def run(kind, seed, H=int(E("H", "1280")), steps=int(E("STEPS", "300")), lr=float(E("LR", "0.1")),
        mu=float(E("MU", "0.9")), alpha=float(E("ALPHA", "0.4")), tau=int(E("TAU", "4")),
        end=E("END", "join"), N=4, B=128, chunk=1024):
    rng = np.random.default_rng(seed)
    net = MLP(H)
    P = net.P
    w = net.init(rng)
    grad = net.grad

    nch = (P + chunk - 1) // chunk
    expand = lambda per_chunk: np.repeat(per_chunk, chunk)[:P]
    shard = np.array_split(rng.permutation(len(XTR)), N)
    r = [np.zeros(P, np.float32) for _ in range(N)]     # residuals
    u = [np.zeros(P, np.float32) for _ in range(N)]     # dgc: worker velocity
    cred = [np.zeros(P, np.float32) for _ in range(N)]  # fill: credits
    age = [np.zeros(nch, np.int64) for _ in range(N)]
    hold_rng = [np.random.default_rng(seed * 100 + k) for k in range(N)]
    v = np.zeros(P, np.float32)

    def step(idx, zero=False):
        nonlocal w, v
        gs = [np.zeros(P, np.float32) if zero else grad(w, XTR[i], YTR[i]) for i in idx]
        if kind == "dense":
            v = mu * v + lr * (sum(gs) / N)
            w -= v
            return
        acc = np.zeros(P, np.float32)
        senders = np.zeros(nch, np.float32)
        sent = []
        for k in range(N):
            if kind == "dgc":
                u[k] = mu * u[k] + gs[k]
                r[k] += u[k]
            else:
                r[k] += gs[k]
            held = (hold_rng[k].random(nch) < alpha) & (age[k] < tau)
            age[k] = np.where(held, age[k] + 1, 0)
            m = expand(~held)
            if kind == "fill":
                acc += np.where(m, r[k] - cred[k], 0)
                cred[k] = np.where(m, 0, cred[k])
                senders += ~held
            else:
                acc += np.where(m, r[k], 0)
            r[k] = np.where(m, 0, r[k])
            if kind == "dgc":
                u[k] = np.where(m, 0, u[k])  # momentum factor masking
            sent.append(m)
        if kind == "fill":
            n = expand(senders)
            mean = np.where(n > 0, acc / np.maximum(n, 1), 0).astype(np.float32)
            for k in range(N):
                cred[k] += np.where(sent[k], 0, mean)
            G = np.where(n > 0, mean, 0)
        else:
            G = acc / N
        if kind == "dgc":
            w -= lr * G
        else:
            v = mu * v + lr * G
            w -= v

    for _ in range(steps):
        step([shard[k][rng.integers(0, len(shard[k]), B)] for k in range(N)])
    if kind != "dense":
        if end == "coast":
            for _ in range(tau + 1):
                step([None] * N, zero=True)
        elif end == "join":
            rest = sum(r[k] - cred[k] for k in range(N)) / N
            if kind == "dgc":
                w -= lr * rest
            else:
                v += lr * rest
                w -= lr * rest
    return net.accuracy(w)


if __name__ == "__main__":
    kinds = sys.argv[1].split(",") if len(sys.argv) > 1 else ["dense", "server", "fill"]
    seeds = [int(s) for s in (sys.argv[2].split(",") if len(sys.argv) > 2 else ["1"])]
    for kd in kinds:
        accs = [run(kd, s) for s in seeds]
        print("%-7s %s mean %.4f" % (kd, " ".join("%.4f" % a for a in accs), np.mean(accs)), flush=True)
