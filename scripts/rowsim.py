#!/usr/bin/env python3
"""Would GDDR's residual save bytes on sparse table rows? (issue 19)

GDDR holds a random share alpha of a dense tensor's chunks back for at most
tau steps: every chunk exists in every push, so holding one merges its
gradients of several steps into one message and a push carries (1 - alpha)
of the chunks (0.6x at alpha 0.4). A row of an embedding table is pushed
only in the steps whose batch touched it. Holding it saves bytes only when
the same row is touched again before it must go (within tau pushes):
the hot rows. A cold row touched once is sent later, alone: no saving.

This replays the row sets of a skip-gram workload (the tokens of the
Python standard library's sources, word2vec's subsampling, 5 negatives a
pair from unigram^0.75, batches of 512 pairs: what
python/examples/skipgram.py trains) through the hold rule of
kernels/residual.c (hold with probability alpha while a row's age is below
tau; a held row not touched again goes when its age reaches tau) and
prints, per table, the rows sent relative to pushing every touched row.

  /usr/bin/python3 scripts/rowsim.py [--steps 300] [--corpus DIR]

Measured (2026-12-03, 1.07M tokens, 30k vocabulary, 300 steps):
  alpha 0.4 tau 4: input rows 0.929x, output rows 0.854x
  alpha 0.4 tau 8: 0.878x, 0.793x;  alpha 0.7 tau 8: 0.797x, 0.660x
against 0.60x for a dense tensor at alpha 0.4. So the residual is not
built for rows (docs/design-decisions.md, "No residual for table rows").
"""
import argparse
import collections
import glob
import re

import numpy as np


def token_ids(corpus, nfiles):
    files = sorted(glob.glob(corpus + "/**/*.py", recursive=True))[:nfiles]
    toks = []
    for f in files:
        with open(f, errors="ignore") as fh:
            toks += [t.lower() for t in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", fh.read())]
    vocab = {w: i for i, (w, _) in enumerate(collections.Counter(toks).most_common(30000))}
    return np.array([vocab[t] for t in toks if t in vocab]), len(vocab)


def row_sets(ids, nv, rng, batch=512, window=5, negatives=5):
    freq = np.bincount(ids, minlength=nv).astype(float)
    p = freq / freq.sum()
    keep = np.minimum(1, np.sqrt(1e-4 / np.maximum(p, 1e-12)))
    neg_p = freq ** 0.75
    neg_p /= neg_p.sum()
    while True:
        c = rng.integers(0, len(ids) - 2 * window, size=batch) + window
        c = c[rng.random(len(c)) < keep[ids[c]]]
        off = rng.integers(1, window + 1, size=len(c)) * rng.choice([-1, 1], size=len(c))
        negs = rng.choice(nv, size=(len(c), negatives), p=neg_p)
        yield np.unique(ids[c]), np.unique(np.concatenate([ids[c + off], negs.ravel()]))


def rows_sent(ids, nv, alpha, tau, steps, which, seed=0):
    rng = np.random.default_rng(seed)
    age, sent, dense = {}, 0, 0
    sets = row_sets(ids, nv, rng)
    for _ in range(steps):
        touched = set(next(sets)[which].tolist())
        dense += len(touched)
        for k in [k for k in age if k not in touched]:
            age[k] += 1
            if age[k] >= tau:  # must go now, alone
                sent += 1
                del age[k]
        for k in touched:
            a = age.get(k, 0)
            if a < tau and rng.random() < alpha:
                age[k] = a + 1
            else:  # sent, with whatever it held merged in
                sent += 1
                age.pop(k, None)
    return sent / dense


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="/usr/lib/python3.11")
    ap.add_argument("--files", type=int, default=600)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    ids, nv = token_ids(args.corpus, args.files)
    print("%d tokens, %d words; rows sent relative to every touched row" % (len(ids), nv))
    for alpha, tau in ((0.4, 4), (0.4, 8), (0.7, 8)):
        print("alpha %.1f tau %d: input rows %.3fx, output rows %.3fx" % (
            alpha, tau, rows_sent(ids, nv, alpha, tau, args.steps, 0),
            rows_sent(ids, nv, alpha, tau, args.steps, 1)))


if __name__ == "__main__":
    main()
