#!/usr/bin/env python3
"""How noisy is a sync step's gradient under GDDR with fill? (server/fill.c)

N workers push unit-variance gradients (pure noise: the signal does not
change the variance). Each holds a chunk back with probability alpha while
its age is below tau (kernels/residual.c) and later sends everything it
gathered minus the credits the server gave it. The server applies, per
step, the sum over the pushes that carried the chunk plus, for every
holder, a fill value (credited to that holder), divided by N:

  dense    nobody holds: the mean of N gradients, variance 1/N
  carriers the fill is the mean over every push that carried the chunk,
           releases included (the rule for SGD)
  fresh    the fill is the mean over the fresh pushes only (workers with
           no hold open on the chunk); no fill when none is fresh (the rule
           for adam, adamw, adagrad)

Prints, for each, the variance of one step's applied gradient and of its
sum over 10 and 50 steps (the sums show the noise evening out: whatever the
rule, everything is applied once in the end), and the share of chunks sent.

  /usr/bin/python3 scripts/fillsim.py [--workers N] [--alpha A] [--tau T]
"""
import argparse

import numpy as np


def run(rule, n_workers, alpha, tau, steps, chunks, rng):
    resid = np.zeros((n_workers, chunks))
    cred = np.zeros((n_workers, chunks))
    age = np.zeros((n_workers, chunks), dtype=int)
    applied, sent = [], 0
    for _ in range(steps):
        g = rng.standard_normal((n_workers, chunks))
        hold = (rng.random((n_workers, chunks)) < alpha) & (age < tau)
        if rule == "dense":
            hold[:] = False
        carry = ~hold
        fresh = carry & (age == 0)
        x = np.where(hold, 0.0, g + resid - cred)  # what each push adds, net of its credits
        n, nf = carry.sum(0), fresh.sum(0)
        if rule == "fresh":
            fill = np.where(nf > 0, (x * fresh).sum(0) / np.maximum(nf, 1), 0.0)
        else:
            fill = np.where(n > 0, x.sum(0) / np.maximum(n, 1), 0.0)
        applied.append((x.sum(0) + (n_workers - n) * fill) / n_workers)
        cred = np.where(hold, cred + fill[None, :], 0.0)
        resid = np.where(hold, resid + g, 0.0)
        age = np.where(hold, age + 1, 0)
        sent += int(n.sum())
    a = np.array(applied)[steps // 4:]
    sums = {k: np.array([a[i:i + k].sum(0) for i in range(0, len(a) - k, k)]).var() for k in (10, 50)}
    return a.var(), sums[10], sums[50], sent / (steps * n_workers * chunks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.4)
    ap.add_argument("--tau", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--chunks", type=int, default=20000, help="independent chunks (samples)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("%d workers, alpha %g, tau %d: variance of the applied step gradient (unit-variance "
          "gradients; dense = 1/N)" % (args.workers, args.alpha, args.tau))
    print("%-9s %10s %10s %10s %8s" % ("rule", "one step", "10 steps", "50 steps", "sent"))
    for rule in ("dense", "carriers", "fresh"):
        rng = np.random.default_rng(args.seed)
        v1, v10, v50, s = run(rule, args.workers, args.alpha, args.tau, args.steps, args.chunks, rng)
        print("%-9s %10.3f %10.3f %10.3f %8.3f" % (rule, v1, v10, v50, s))


if __name__ == "__main__":
    main()
