#!/usr/bin/python3
"""adamsim.py -- a numpy model of gddr-ps in async mode running Adam, with GDDR workers, for trying
an idea about held chunks in seconds before building it in C (docs/design-decisions.md, "Adam with
held chunks").

8 workers take turns in a random order each round (so a push is 0 to 2N-2 versions stale, N-1 on
average), MLP 784-128-10 on Fashion-MNIST (Debian's dataset-fashion-mnist), batch 64, 2 epochs of
each worker's eighth, the server's Adam (lr 0.001, betas 0.9 0.999, eps 1e-8, bias correction by
the version) with AdaDelay (lr / (1 + ADADELAY * staleness)), GDDR's random chunk holds (alpha,
tau, chunk 1024), each worker's flush at the end, and the test accuracy of the model the *server*
ends with.

    scripts/adamsim.py KINDS [SEEDS]      e.g. scripts/adamsim.py dense,hold,fill 1,2,3
    environment: N (8), EPOCHS (2), LR (0.001), ADADELAY (0.1), ALPHA (0.4), TAU (4),
                 NONIID (0: each worker a random eighth; q: a share q of the data dealt out
                 sorted by label, so each worker sees mostly its own classes)

Kinds:
  sync    sync dense (the target's reference): one Adam step on the mean of N pushes
  dense   async, every chunk sent every push
  hold    GDDR: a held chunk is not stepped; its gradients arrive, summed, when it is sent
  fill    GDDR with async fill as gddr-ps ran it before (async_fill = moment): a held chunk is
          stepped with m-hat, which is credited to the worker and taken off what it sends later
  recent  GDDR with async fill as gddr-ps runs it (async_fill = recent, server/apply.c): a held
          chunk is stepped with the chunk's values in the last push that carried it fresh (from
          a worker that had not held it since it last sent it), m-hat before there is one;
          BF=b makes it an EMA of the fresh pushes with decay b instead (b = 0: the last one)
  recent1   recent as gddr-ps runs it since 2026-12-04: the last fresh values only if another
            worker pushed them and this holder was not given them before; else the held chunk
            is not stepped (it waits for its release)
  recentw   recent, but the worker's own last fresh values of the chunk (its own data)
  recentall recent, but the mean of every worker's last fresh values of the chunk
  recentcv  recent plus the worker's bias against it: an EMA (decay CV, 0.9) of its fresh values
            less the recent values they replaced (a control variate, as SCAFFOLD's)
          FS=s scales recent's estimate by s
  preview   GDDR where a held chunk is not absent: it goes as PB-bit codes (PB=1: sign times
            the chunk's mean magnitude; PB>1: 2^(PB-1)-1 levels a side, rounded at random) and
            its coding error stays in the residual (error feedback), so nothing needs a fill
  zero    GDDR: a held chunk is stepped with a zero gradient (Adam's moments coast); its
          gradients arrive, summed, when it is sent
  fillage fill, with the released deviation (what was held, less the credits) scaled by
          AdaDelay's factor for its own age, 1 / (1 + ADADELAY * N * pushes held)
  fillv   fill, and v (Adam's second moment) updated from fresh gradients only: not from fills,
          not from releases (the 1-bit Adam idea: keep compression out of v)
  holdrep hold, and a released chunk stepped age+1 times with the mean of what it held (as if
          its gradient had stood still while it was held)
  filldirect fill, and the released deviation applied at once, divided by Adam's sqrt(v-hat), and
          kept out of m (the same total step it would make through m, without the delay)
  fillnew fill, and the held gradients never sent (lossy: a bound, not a candidate -- it breaks
          GDDR's "nothing is lost")
WARM=S ramps alpha up from 0 over each worker's first S steps.
HOLD=smallest holds the alpha share of chunks with the least (r + g)^2 instead of a random draw
(hold_schedule = smallest). VDIV=p (recent1): a release, held for a pushes, enters v as
d^2 / (a + 1)^p instead of d^2.

Measured on 2 cores (about 20 s a run, 2 at a time), server's final model, seeds 1-6:
  dense 0.8007 0.8268 0.8177 0.7978 0.7894 0.7837   mean 0.8027
  fill  0.7702 0.7462 0.8213 0.7589 0.7763 0.7970   mean 0.7783  (-2.4 pp)
  zero  0.7946 0.7742 0.8058 0.7955 0.7855 0.7782   mean 0.7890  (-1.4 pp)
  fillage                                           mean 0.7723  (-3.0 pp)
  fill, WARM=23 (the first tenth of the run)        mean 0.7733  (-2.9 pp)
  fillnew 0.7943 0.8055 0.8054 0.8212 0.7827 0.8075 mean 0.8028  (+0.0 pp)
  fillv 0.3379 0.2056 0.6006 0.7702 0.6672 0.3434   mean 0.4875  (diverges: a release's lump
        enters m, and only v seeing it keeps the step it makes bounded)
  recent  0.8066 0.8078 0.7857 0.8240 0.7890 0.7972 mean 0.8017  (-0.1 pp)
          seeds 7-12: 0.7872 (dense 0.8049, fill 0.7797): over twelve seeds -0.9 pp against
          fill's -2.5 pp. BF=0.3 seeds 1-6: 0.7917; BF=0.5: 0.7972 (seeds 7-12 0.7848);
          BF=0.8: 0.7581. The fresher the estimate, the better: m-hat (an EMA with beta1 0.9)
          lags, and what it misses arrives late with the release. In gddr-ps (8 async workers,
          docs/results.md) recent took the gap to sync dense from -0.65 to -0.15 pp.
  seeds 1-3: sync 0.8397, hold 0.7812
  holdrep 0.7745 0.7573 0.7748 0.7823 0.7390 0.7810 mean 0.7681  (-3.5 pp; hold 0.7722)
  filldirect 0.5501 0.5440 0.6243 0.7279 0.6815 0.5923 mean 0.6200  (-18 pp: a lump of several
        gradients divided by a v of single gradients is too large a step at once)
  fill with a shorter tau (the held mass arrives sooner), against dense, by seeds:
    TAU=1 seeds 1-6   fill 0.7865                                  (-1.6 pp)
    TAU=2 seeds 1-6   fill 0.7955                                  (-0.7 pp)
    TAU=2 seeds 7-12  fill 0.7681, dense 0.8049                    (-3.7 pp)
    TAU=4 seeds 7-12  fill 0.7797                                  (-2.5 pp)
  so tau 2 is within the seeds' spread of tau 4 (twelve seeds: -2.2 pp against -2.5 pp).
  recent1 0.7765 0.7912 0.7728 0.8047 0.7978 0.7882 mean 0.7885  (-1.4 pp; gddr-ps, 8 async
          MLP workers: +0.03 pp against sync dense, where recent gave -0.15 on average)
  One worker (N=1, seeds 1 2): dense 0.8512, recent 0.8495, recent1 = hold 0.8478; the
          transformer with one worker lost 10 % with recent and 1.8 % with recent1
          (docs/results-lm.md): this model does not show what one worker's fill costs there.
  Workers on different data (NONIID=0.8), seeds 1-6 (2026-12-04):
    dense     0.8318 0.8138 0.8194 0.8032 0.8084 0.8063 mean 0.8138
    recent    0.8220 0.8159 0.8202 0.8013 0.7738 0.7972 mean 0.8051  (-0.9 pp; -0.1 on IID data)
    recentw   0.7885 0.7895 0.8116 0.7844 0.7513 0.7829 mean 0.7847  (-2.9 pp)
    recentall 0.7783 0.7976 0.8051 0.7739 0.7855 0.8096 mean 0.7917  (-2.2 pp)
    recentcv  0.8167 0.8026 0.8188 0.8294 0.7893 0.7913 mean 0.8080  (-0.6 pp; CV=0.5: 0.8058)
    recent FS=0.5 0.7895 0.8212 0.7955 0.7988 0.7688 0.8133 mean 0.7979 (-1.6 pp)
  So a worker's own data costs recent some (the fill is another worker's batch), yet the
  estimates of the worker's own data are older and lose more; correcting recent by the worker's
  bias gains 0.3 pp, inside the seeds' spread, for a copy of the model per worker: not built.
  Held chunks sent as low-bit previews (error feedback; seeds 1-6, IID, dense 0.8027):
    preview PB=1 0.7745 0.7696 0.7483 0.8185 0.7934 0.7860 mean 0.7817  (-2.1 pp)
    preview PB=2 0.7637 0.7918 0.7849 0.8099 0.8112 0.7937 mean 0.7925  (-1.0 pp)
    preview PB=4 0.8127 0.7716 0.8107 0.7936 0.7653 0.7728 mean 0.7878  (-1.5 pp)
  each worse than recent (-0.1 pp) for 1.6-6 % more bytes: the codes' error, sent later, is
  what arrives late now, and Adam's v sees the coding noise. Not built.
  Holding the smallest chunks (HOLD=smallest, recent1, seeds 1-6, 2026-12-05):
    0.7724 0.7955 0.7630 0.8017 0.7430 0.7545 mean 0.7717  (-3.1 pp; random holds -1.4 pp)
  Releases into v divided by their age (recent1, seeds 1-6, 2026-12-05):
    VDIV=1   0.7885 0.8213 0.7728 0.7878 0.8247 0.7665 mean 0.7936  (-0.9 pp)
    VDIV=0.5 0.7753 0.7580 0.7570 0.8061 0.7937 0.7691 mean 0.7765  (-2.6 pp)
  both inside the seeds' spread of recent1's -1.4 pp, in opposite directions.
So in this model what costs is the held mass arriving late (less the credits: the deviation of
the held gradients from m-hat), not the fill, nor the first steps: drop it and GDDR is dense;
scale it by its age, or ramp alpha up, and it still costs. What shrinks it is a credit closer
to what the held gradients will be: the chunk's last fresh push (recent) leaves a deviation of
noise only, where m-hat's lag was signal arriving late. The model is harsher than gddr-ps
on 2 cores: every worker is N-1 versions stale on average, and async dense itself loses 3.7 pp
to sync here, where gddr-ps gained 0.05-0.59 pp (docs/results.md).
"""
import os
import sys

import numpy as np

from simmlp import MLP, XTR, YTR

E = os.environ.get
NET = MLP(128)
P = NET.P
grad, accuracy = NET.grad, NET.accuracy


class Server:
    def __init__(self, w, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.w, self.lr, self.b1, self.b2, self.eps = w, lr, b1, b2, eps
        self.m = np.zeros(P, np.float32)
        self.v = np.zeros(P, np.float32)
        self.version = 0
        self.f = np.zeros(P, np.float32)     # recent: the last fresh values (or their EMA)
        self.fw = np.zeros(P, np.float32)    # recent: the EMA's weight, 0 = none yet

    def mhat(self):
        k = self.version + 1
        return self.m / (1 - self.b1 ** (k - 1)) if k > 1 else np.zeros(P, np.float32)

    def adam(self, d, lr, vmask=None, vscale=None):
        k = self.version + 1
        self.m = self.b1 * self.m + (1 - self.b1) * d
        v = self.b2 * self.v + (1 - self.b2) * d * d * (1 if vscale is None else vscale)
        self.v = v if vmask is None else np.where(vmask, v, self.v)
        step = (self.m / (1 - self.b1 ** k)) / (np.sqrt(self.v / (1 - self.b2 ** k)) + self.eps)
        self.w = (self.w - lr * step).astype(np.float32)
        self.version = k


def r_sent_mean(d, n):
    return d / np.maximum(n, 1)


def run(kind, seed, N=int(E("N", "8")), epochs=int(E("EPOCHS", "2")), lr=float(E("LR", "0.001")),
        adadelay=float(E("ADADELAY", "0.1")), alpha=float(E("ALPHA", "0.4")), tau=int(E("TAU", "4")),
        B=64, chunk=1024):
    rng = np.random.default_rng(seed)
    w = NET.init(rng)
    srv = Server(w, lr)
    nch = (P + chunk - 1) // chunk
    expand = lambda per_chunk: np.repeat(per_chunk, chunk)[:P]
    noniid = float(E("NONIID", "0"))
    perm = rng.permutation(len(XTR))
    cut = int(noniid * len(perm))  # this share of the data dealt out sorted by label
    srt = perm[:cut][np.argsort(YTR[perm[:cut]], kind="stable")]
    shard = [np.concatenate([a, b]) for a, b in zip(np.array_split(srt, N), np.array_split(perm[cut:], N))]
    steps = epochs * (len(shard[0]) // B)
    order = [rng.permutation(shard[k]) for k in range(N)]
    batch = lambda k, s: order[k][(s * B) % (len(order[k]) - B):][:B]
    if kind == "sync":
        for s in range(steps):
            srv.adam(sum(grad(srv.w, XTR[batch(k, s)], YTR[batch(k, s)]) for k in range(N)) / N, lr)
        return accuracy(srv.w)
    view = [srv.w.copy() for _ in range(N)]       # what each worker pulled
    base = [0] * N                                # the version it pulled
    r = [np.zeros(P, np.float32) for _ in range(N)]
    cred = [np.zeros(P, np.float32) for _ in range(N)]
    age = [np.zeros(nch, np.int64) for _ in range(N)]
    hold_rng = [np.random.default_rng(seed * 100 + k) for k in range(N)]

    warm = int(E("WARM", "0"))
    fsrc = np.full(P, -1)                      # recent1: who pushed the last fresh values,
    fstamp = np.zeros(P, np.int64)             # when, and what each holder was last given
    used = [np.full(P, -1, np.int64) for _ in range(N)]
    own = [np.zeros(P, np.float32) for _ in range(N)]   # recentw, recentall: a worker's last fresh
    ownw = [np.zeros(P, np.float32) for _ in range(N)]  # values (recentcv: its bias), and whether set

    def push(k, g, s=0, flush=False):
        a = alpha * min(1.0, s / warm) if warm else alpha
        stale = srv.version - base[k]
        lr_eff = lr / (1 + adadelay * stale)
        if kind == "dense":
            srv.adam(g, lr_eff)
            return
        old = r[k] - cred[k]          # what is still owed from earlier pushes, net of credit
        r[k] += g
        if flush:
            held = np.zeros(nch, bool)
        elif E("HOLD") == "smallest":   # hold_schedule = smallest: the least r + g held
            sc = (np.pad(r[k], (0, nch * chunk - P)).reshape(nch, chunk).astype(np.float64) ** 2).sum(1)
            young = np.flatnonzero(age[k] < tau)
            want = int(a * nch) + (hold_rng[k].random() < a * nch - int(a * nch))
            held = np.zeros(nch, bool)
            held[young[np.lexsort((young, sc[young]))[:want]]] = True
        else:
            held = (hold_rng[k].random(nch) < a) & (age[k] < tau)
        age_before = age[k].copy()
        age[k] = np.where(held, age[k] + 1, 0)
        m = expand(~held)
        d = np.where(m, r[k], 0).astype(np.float32)
        r[k] = np.where(m, 0, r[k])
        if kind == "preview":   # held chunks go as PB-bit codes, their error kept (no fill)
            B = int(E("PB", "2"))
            xc = np.pad(r[k], (0, nch * chunk - P)).reshape(nch, chunk)
            if B == 1:   # sign times the chunk's mean magnitude
                q = np.sign(xc) * np.abs(xc).mean(1, keepdims=True)
            else:        # 2^(B-1) - 1 levels a side of the chunk's max, rounded at random (unbiased)
                sc = np.abs(xc).max(1, keepdims=True) / (2 ** (B - 1) - 1)
                y = xc / np.maximum(sc, 1e-30)
                q = (np.floor(y) + (hold_rng[k].random(y.shape) < y - np.floor(y))) * sc
            q = np.where(m, 0, q.reshape(-1)[:P]).astype(np.float32)
            r[k] = (r[k] - q).astype(np.float32)
            srv.adam((d + q).astype(np.float32), lr_eff)
            return
        if kind == "holdrep":
            # held chunks frozen; at release the summed gradient is applied as (age+1) Adam
            # sub-steps of its mean (as if the gradient had been constant while held)
            n = expand(np.where(~held, age_before + 1, 0))
            dm = np.where(m, r_sent_mean(d, n), 0).astype(np.float32)
            k1 = srv.version + 1
            for j in range(int(n.max())):
                sel = n > j
                mm = srv.b1 * srv.m + (1 - srv.b1) * dm
                vv = srv.b2 * srv.v + (1 - srv.b2) * dm * dm
                srv.m = np.where(sel, mm, srv.m)
                srv.v = np.where(sel, vv, srv.v)
                st = (srv.m / (1 - srv.b1 ** k1)) / (np.sqrt(srv.v / (1 - srv.b2 ** k1)) + srv.eps)
                srv.w = np.where(sel, srv.w - lr_eff * st, srv.w).astype(np.float32)
            srv.version = k1
            return
        if kind == "hold":
            # held chunks are not stepped: Adam sees d = 0 there? No: the server skips them
            keep_m, keep_v, keep_w = srv.m.copy(), srv.v.copy(), srv.w.copy()
            srv.adam(d, lr_eff)
            srv.m = np.where(m, srv.m, keep_m)
            srv.v = np.where(m, srv.v, keep_v)
            srv.w = np.where(m, srv.w, keep_w)
            return
        mh = srv.mhat()
        if kind == "fillv":         # fill, and v sees fresh gradients only (not fills, not releases)
            fresh = m & expand(age_before == 0)
            d = np.where(m, d - cred[k], mh).astype(np.float32)
            cred[k] = np.where(m, 0, cred[k] + mh)
            srv.adam(d, lr_eff, fresh)
            return
        if kind == "recent1":   # as gddr-ps runs it: another worker's fresh values, once per holder
            fr = m & expand(age_before == 0)
            ok = (~m) & (srv.fw > 0) & (fsrc != k) & (fstamp != used[k])
            used[k] = np.where(ok, fstamp, used[k])
            fv = np.where(ok, srv.f, 0).astype(np.float32)
            wait = (~m) & ~ok          # not stepped: m, v and w stay
            d = np.where(m, d - cred[k], fv).astype(np.float32)
            cred[k] = np.where(m, 0, cred[k] + fv).astype(np.float32)
            srv.f = np.where(fr, g, srv.f)
            srv.fw = np.where(fr, 1, srv.fw)
            fsrc[:] = np.where(fr, k, fsrc)
            fstamp[:] = np.where(fr, srv.version + 1, fstamp)
            keep = srv.m.copy(), srv.v.copy(), srv.w.copy()
            vs = None
            if E("VDIV"):   # a release (held age_before pushes) enters v as d^2 / (age+1)^VDIV
                vs = np.where(m, 1.0 / expand(age_before + 1.0) ** float(E("VDIV")), 1.0)
            srv.adam(d, lr_eff, vscale=vs)
            srv.m, srv.v, srv.w = (np.where(wait, a0, a1) for a0, a1 in zip(keep, (srv.m, srv.v, srv.w)))
            return
        if kind in ("recent", "recentw", "recentall", "recentcv"):
            fr = m & expand(age_before == 0)   # the chunks this push carries fresh
            last = np.where(srv.fw > 0, srv.f / np.maximum(srv.fw, 1e-12), mh).astype(np.float32)
            if kind == "recent":
                fv = float(E("FS", "1")) * last
            elif kind == "recentw":
                fv = np.where(ownw[k] > 0, own[k], mh)
            elif kind == "recentcv":
                fv = last + own[k]
                cvd = float(E("CV", "0.9"))
                own[k] = np.where(fr & (srv.fw > 0), cvd * own[k] + (1 - cvd) * (g - last), own[k])
            if kind in ("recentw", "recentall"):
                own[k] = np.where(fr, g, own[k])
                ownw[k] = np.where(fr, 1, ownw[k])
            if kind == "recentall":
                cnt = sum(ownw)
                fv = np.where(cnt > 0, sum(own) / np.maximum(cnt, 1), mh)
            bf = float(E("BF", "0")) if kind == "recent" else 0.0
            srv.f = np.where(fr, bf * srv.f + (1 - bf) * g, srv.f)
            srv.fw = np.where(fr, bf * srv.fw + (1 - bf), srv.fw)
            d = np.where(m, d - cred[k], fv).astype(np.float32)
            cred[k] = np.where(m, 0, cred[k] + fv).astype(np.float32)
            srv.adam(d, lr_eff)
            return
        if kind == "fill":
            d = np.where(m, d - cred[k], mh).astype(np.float32)
        elif kind == "zero":      # a held chunk is stepped with a zero gradient (Adam coasts)
            d = np.where(m, d, 0).astype(np.float32)
        elif kind == "filldirect":  # the late deviation applied at once, preconditioned, not via m
            d = np.where(m, g, mh).astype(np.float32)
            cred[k] = np.where(m, 0, cred[k] + mh)
            srv.adam(d, lr_eff)
            k1 = srv.version
            vh = np.sqrt(srv.v / (1 - srv.b2 ** k1)) + srv.eps
            srv.w = (srv.w - lr_eff * np.where(m, old, 0) / vh).astype(np.float32)
            return
        elif kind == "fillnew":   # lossy bound: the late deviation is dropped
            d = np.where(m, g, mh).astype(np.float32)
        elif kind == "fillage":   # the late deviation scaled by AdaDelay's factor for its age
            f = expand(1.0 / (1.0 + adadelay * N * np.maximum(age_before, 0)))
            d = np.where(m, g + old * f, mh).astype(np.float32)
        cred[k] = np.where(m, 0, cred[k] + mh)
        srv.adam(d, lr_eff)

    for s in range(steps):
        for k in rng.permutation(N):
            push(k, grad(view[k], XTR[batch(k, s)], YTR[batch(k, s)]), s)
            view[k], base[k] = srv.w.copy(), srv.version
    if kind != "dense":
        for k in range(N):
            push(k, np.zeros(P, np.float32), flush=True)
    return accuracy(srv.w)


if __name__ == "__main__":
    kinds = sys.argv[1].split(",") if len(sys.argv) > 1 else ["sync", "dense", "fill"]
    seeds = [int(s) for s in (sys.argv[2].split(",") if len(sys.argv) > 2 else ["1"])]
    from multiprocessing import Pool
    pool = Pool(int(E("JOBS", "2")))
    for kd in kinds:
        accs = pool.starmap(run, [(kd, s) for s in seeds])
        print("%-7s %s mean %.4f" % (kd, " ".join("%.4f" % a for a in accs), np.mean(accs)), flush=True)
