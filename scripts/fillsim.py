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
  fresh-rotating   the same fill; each chunk held by exactly floor(alpha N)
           or one more workers, a window of ranks drawn afresh each step
           (tried, not kept: docs/design-decisions.md)
  fresh-staggered  the same fill; the holds of hold_schedule = staggered
           (kernels/residual.c): tau steps of a cycle of floor(tau/alpha),
           the workers' windows spread evenly over it

Prints, for each, the variance of one step's applied gradient and of its
sum over 10 and 50 steps (the sums show the noise evening out: whatever the
rule, everything is applied once in the end), the share of chunks sent, and the share of chunk-steps that no worker sends
fresh (no fill: the chunk's signal comes late).

  /usr/bin/python3 scripts/fillsim.py [--workers N] [--alpha A] [--tau T]
"""
import argparse

import numpy as np


def run(rule, n_workers, alpha, tau, steps, chunks, rng):
    resid = np.zeros((n_workers, chunks))
    cred = np.zeros((n_workers, chunks))
    age = np.zeros((n_workers, chunks), dtype=int)
    applied, sent, none_fresh = [], 0, 0
    period = max(int(tau / alpha), tau + 1)
    # the chunk's place in the cycle (its hash); its own generator, so the
    # other rules draw what they drew before this one existed
    start = np.random.default_rng(12345).integers(0, period, chunks)
    ranks = np.arange(n_workers)[:, None]
    for step in range(steps):
        g = rng.standard_normal((n_workers, chunks))
        if rule == "fresh-rotating":
            pn = alpha * n_workers
            k = np.floor(pn) + (rng.random(chunks) < pn - np.floor(pn))
            pos = (ranks + rng.integers(0, n_workers, chunks)[None, :]) % n_workers
            hold = (pos < k[None, :]) & (age < tau)
        elif rule == "fresh-staggered":
            phase = (ranks * period // n_workers + step) % period
            hold = ((start[None, :] + phase) % period < tau) & (age < tau)
        else:
            hold = (rng.random((n_workers, chunks)) < alpha) & (age < tau)
        if rule == "dense":
            hold[:] = False
        carry = ~hold
        fresh = carry & (age == 0)
        x = np.where(hold, 0.0, g + resid - cred)  # what each push adds, net of its credits
        n, nf = carry.sum(0), fresh.sum(0)
        if rule.startswith("fresh"):
            fill = np.where(nf > 0, (x * fresh).sum(0) / np.maximum(nf, 1), 0.0)
        else:
            fill = np.where(n > 0, x.sum(0) / np.maximum(n, 1), 0.0)
        applied.append((x.sum(0) + (n_workers - n) * fill) / n_workers)
        cred = np.where(hold, cred + fill[None, :], 0.0)
        resid = np.where(hold, resid + g, 0.0)
        age = np.where(hold, age + 1, 0)
        sent += int(n.sum())
        if step >= steps // 4:
            none_fresh += int((nf == 0).sum())
    a = np.array(applied)[steps // 4:]
    sums = {k: np.array([a[i:i + k].sum(0) for i in range(0, len(a) - k, k)]).var() for k in (10, 50)}
    return (a.var(), sums[10], sums[50], sent / (steps * n_workers * chunks),
            none_fresh / (len(a) * chunks))


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
    print("%-16s %10s %10s %10s %8s %11s" % ("rule", "one step", "10 steps", "50 steps", "sent",
                                             "none fresh"))
    for rule in ("dense", "carriers", "fresh", "fresh-rotating", "fresh-staggered"):
        rng = np.random.default_rng(args.seed)
        v1, v10, v50, s, nofresh = run(rule, args.workers, args.alpha, args.tau, args.steps,
                                       args.chunks, rng)
        print("%-16s %10.3f %10.3f %10.3f %8.3f %11.3f" % (rule, v1, v10, v50, s, nofresh))


if __name__ == "__main__":
    main()
