#!/usr/bin/env python3
"""The step time of data-parallel training through GDDR's parameter servers
at cluster scale: a small discrete-event model (docs/scale.md).

W workers, S servers; the model (P floats) is sharded evenly, so every
worker sends 1/S of its push to each server and pulls 1/S from each. Each
step of a worker: compute (a timer: the accelerator), the client's step
(GDDR selection and packing on the host CPU), the push, then the pull and
its decode. Resources, each shared equally by the flows on it at a time
(processor sharing: a message gets capacity / (messages on it); it moves at
the pace of its scarcest resource):

  per worker  NIC up, NIC down (full duplex, L_w), the client's calling
              thread (packing, decode, copies), its ZeroMQ I/O thread
  per server  NIC in, NIC out (L_s: every worker's message to this server
              shares it -- incast), the ZeroMQ I/O thread (kernel copies,
              both directions), the front thread (per message; validation
              of pushes; 8-bit delta encoding of pulls), the apply pool
              (A threads; one per update)

Servers are identical and every worker loads each equally, so the S servers
are simulated as one with S times the capacity; workers are simulated in G
groups of W/G identical workers (the group's messages count W/G times on
the shared resources), each group with its own compute jitter.

sync:  compute -> pack -> push (acked once validated) -> added into the
       step's sum (apply pool) -> when all W are in: the optimizer's update
       of each shard (apply pool) -> every waiting pull answered -> decode
async: compute -> pack -> push -> its update (apply pool) -> pull (waits
       for the worker's own update) -> decode

Usage:
  scripts/scalesim.py --validate            model vs the measured step times
  scripts/scalesim.py --check               invariants + validation (< 10 s)
  scripts/scalesim.py --sweep --params 340e6 --compute-ms 250 --out F
                                            the grid of docs/scale.md's plots
                                            (scripts/scale-plot.sh draws them)
  scripts/scalesim.py --servers-needed -W 64 --gbit 25 --params 340e6 [--variant gddr]
                                            S = 1, 2, 4, ... 2W and what bounds each
  scripts/scalesim.py -W 256 -S 16 --gbit 25 --params 340e6 --compute-ms 300 --mode sync
"""
import argparse
import heapq
import math
import sys
import time

import numpy as np

# ---- measured constants (this 2-core machine, 2026-12-03) ------------------
# Every per-byte cost is seconds per byte of the dense tensor (4 bytes a
# float) unless it says per float; "per rt" is per round trip (a request and
# its reply). Sources (docs/scale.md, "Constants"; raw lines in
# docs/scale-data/):
#   A  scripts/scale-measure.sh --reps 3 ; scripts/scale-measure.sh --reps 3 --mode sync
#      (one client, one gddr-ps; CPU per gddr_step from CLOCK_THREAD_CPUTIME_ID,
#      CLOCK_PROCESS_CPUTIME_ID and /proc/PID/stat; medians of the 6 runs;
#      4 KiB tensor for the fixed costs, 16 MiB for the per-byte ones)
#   B  build/bin/gddr-bench --sections apply,gddr --reps 5 --budget-mb 64 (medians)
#   C  docs/network-data/*/results.txt: bytes on the veth / bytes the workers
#      counted (TCP/IP and ZeroMQ framing)
CONST = {
    # A, 4 KiB: client process CPU 145 us a step (2 round trips)
    "cli_rt_s": 72e-6,
    # A, 4 KiB: gddr-ps CPU 105 us a step (2 round trips), on its front thread
    "srv_rt_s": 52e-6,
    # A, 16 MiB dense: client thread 5.6 ms a step, the pulled values copied
    # into the caller's parameters: per float pulled
    "cli_pull_per_float": 1.33e-9,
    # A, 16 MiB with pull_delta_bits 8: client thread 6.4 ms: decode per float
    "cli_q8_per_float": 1.5e-9,
    # A, 16 MiB: client thread 13.9 ms at alpha 0.4 vs 5.6 dense: GDDR's
    # selection, residual and packing, per float of the gradient
    "cli_gddr_per_float": 1.95e-9,
    # A, 16 MiB dense: client process 12.9 ms - thread 5.6 ms over 33.5 MB
    # moved: the client's ZeroMQ I/O thread and kernel copies, per byte
    "cli_io_per_byte": 0.218e-9,
    # B: validation pass (norm + finiteness) 11.5 GB/s, front thread
    "srv_val_per_byte": 1 / 11.5e9,
    # B: apply (SGD) 3.30 GB/s per thread, apply pool
    "srv_apply_per_byte": 1 / 3.30e9,
    # A, 16 MiB dense: gddr-ps 18 ms a step - apply 5.1 - validation 1.5 over
    # 33.5 MB: its ZeroMQ I/O thread and kernel copies, per byte either way
    "srv_io_per_byte": 0.34e-9,
    # A, 16 MiB q8: gddr-ps 32.5 ms vs 18 dense, plus the 4.2 ms of I/O the
    # smaller reply saves: the delta encoding (two passes over the value and
    # the worker's view), per float pulled, on the front thread
    "srv_q8_per_float": 4.4e-9,
    # C: 4104193 / 4070570 (dense push, 100 Mbit/s runs): bytes on the wire
    # per byte of payload through tc's accounting (GSO: headers once per
    # 64 KiB); a real NIC with 1500-byte frames adds ~6% (overhead_nic)
    "overhead_veth": 1.0083,
    "overhead_nic": 1.06,
    # the measured GDDR ratios (docs/network.md): bytes of a push at alpha
    # 0.4 and of an 8-bit delta pull, per byte of the dense one
    "gddr_push_ratio": 0.60,
    "q8_pull_ratio": 0.26,
    # gddr-train --workload mlp --hidden 1280 --batch 128 --steps 40 --step-times
    # (one worker, loopback): compute_seconds 0.85 / 40 = 21 ms a gradient on
    # one core of this machine; step p95 / mean 34.8 / 28.8: the compute's
    # spread, as a lognormal sigma, ~0.1
    "net_compute_ms": 21.0,
    "compute_cv": 0.1,
    # NOT measured: fitted. TCP flows through one bottleneck do not share it
    # equally; each message gets a weight ~ lognormal(0, tcp_unfair) and the
    # NIC is shared in proportion (0 = exact fair share). Chosen from
    # {0, 0.5, 1, 1.5}: the one that keeps every network row within 20% (docs/scale.md).
    "tcp_unfair": 1.0,
}


# ---- the discrete-event engine ----------------------------------------------
class Sim:
    """Fluid flows over shared resources, event by event.

    A flow needs d[r] seconds of resource r at full capacity; while k units
    of flow are active on r each unit gets min(cap[r] / k, maxshare[r]);
    the flow progresses at min over r of share / d[r] (its fraction per
    second). Events: a flow finishing, a timer firing."""

    def __init__(self):
        self.names, self.cap, self.maxshare = {}, [], []
        self.t = 0.0
        self.timers = []
        self.seq = 0
        self.flows = {}   # id -> [remaining fraction, res idx array, demand array, mult, cb]
        self.fifo = []    # resources that serve their flows in arrival order
        self.weighted = []  # resources shared in proportion to the flows' weights

    def res(self, name, cap, maxshare=None, fifo=False, weighted=False):
        self.names[name] = len(self.cap)
        self.cap.append(float(cap))
        self.maxshare.append(float(maxshare if maxshare is not None else cap))
        if fifo:
            self.fifo.append(self.names[name])
        if weighted:
            self.weighted.append(self.names[name])
        return self.names[name]

    def timer(self, dt, cb):
        self.seq += 1
        heapq.heappush(self.timers, (self.t + dt, self.seq, cb))

    def flow(self, demands, mult, cb, weight=1.0):
        d = {}
        for r, x in demands:   # one resource named twice (the shared host): its demands add
            if x > 0:
                d[r] = d.get(r, 0.0) + x
        if not d:
            self.timer(0.0, cb)
            return
        self.seq += 1
        self.flows[self.seq] = [1.0, np.array(list(d)), np.array(list(d.values())), mult, cb,
                                weight]

    def run(self, until_cb):
        cap = np.array(self.cap)
        self.work = np.zeros(len(cap))
        ms = np.array(self.maxshare)
        while not until_cb():
            if self.flows:
                ids = list(self.flows)
                fl = [self.flows[i] for i in ids]
                load = np.zeros(len(cap))
                wload = np.zeros(len(cap))
                for f in fl:
                    load[f[1]] += f[3]
                    wload[f[1]] += f[3] * f[5]
                share = np.minimum(cap / np.maximum(load, 1e-300), ms)
                if self.weighted:
                    # TCP's unequal shares: on these resources a flow gets cap x its weight
                    # / the sum of the weights (at most maxshare)
                    wl = wload[self.weighted]
                    wcap = cap[self.weighted] / np.maximum(wl, 1e-300)
                shares = None
                if self.fifo:
                    # first come, first served: each flow in arrival order takes what it
                    # can use (maxshare a unit) of what the earlier ones left
                    shares = [share[f[1]].copy() for f in fl]
                    for r in self.fifo:
                        avail = cap[r]
                        for k, f in enumerate(fl):
                            hit = np.nonzero(f[1] == r)[0]
                            if hit.size:
                                give = min(ms[r] * f[3], avail)
                                shares[k][hit] = give / f[3]
                                avail -= give
                    rates = np.array([np.min(sh / f[2]) for sh, f in zip(shares, fl)])
                elif self.weighted:
                    rates = []
                    for f in fl:
                        sh = share[f[1]].copy()
                        for j, r in enumerate(self.weighted):
                            hit = f[1] == r
                            if hit.any():
                                sh[hit] = min(wcap[j] * f[5], ms[r])
                        rates.append(np.min(sh / f[2]))
                    rates = np.array(rates)
                else:
                    rates = np.array([np.min(share[f[1]] / f[2]) for f in fl])
                rem = np.array([f[0] for f in fl])
                with np.errstate(divide="ignore"):
                    tfin = np.where(rates > 0, rem / np.maximum(rates, 1e-300), math.inf)
                dt_f = float(np.min(tfin))
            else:
                dt_f = math.inf
            dt_t = self.timers[0][0] - self.t if self.timers else math.inf
            if dt_f == math.inf and dt_t == math.inf:
                raise RuntimeError("scalesim: deadlock")
            dt = min(dt_f, dt_t)
            done = []
            if self.flows:
                for i, f, r, tf in zip(ids, fl, rates, tfin):
                    f[0] -= r * dt
                    self.work[f[1]] += r * dt * f[2] * f[3]
                    if tf <= dt * (1 + 1e-9) + 1e-15:
                        done.append(i)
            self.t += max(dt, 0.0)
            cbs = [self.flows.pop(i)[4] for i in done]
            while self.timers and self.timers[0][0] <= self.t + 1e-15:
                cbs.append(heapq.heappop(self.timers)[2])
            for cb in cbs:
                cb()


# ---- one configuration --------------------------------------------------------
def simulate(W, S, mode="sync", params=25e6, gbit=25.0, server_gbit=None, compute_ms=100.0,
             gddr=False, q8=None, apply_threads=2, groups=32, steps=6, jitter=None, seed=1,
             overhead=None, colocate_cores=None, fifo=False, unfair=None, const=CONST,
             detail=False):
    """Mean step time (s) of a worker, after the first step.

    gddr: GDDR pushes (alpha 0.4); q8: 8-bit delta pulls (default: as gddr).
    gbit: each worker's NIC; server_gbit: each server's (default the same;
    inf: no limit). colocate_cores: every CPU cost (and the compute) also
    shares one host of that many cores (the validation runs: workers and
    server on one 2-core machine)."""
    c = const
    q8 = gddr if q8 is None else q8
    jitter = c["compute_cv"] if jitter is None else jitter
    unfair = c["tcp_unfair"] if unfair is None else unfair
    server_gbit = gbit if server_gbit is None else server_gbit
    overhead = c["overhead_nic"] if overhead is None else overhead
    G = min(W, groups)
    mult = [W // G + (1 if g < W % G else 0) for g in range(G)]
    rng = np.random.default_rng(seed)
    sim = Sim()
    Lw = gbit * 1e9 / 8
    Ls = server_gbit * 1e9 / 8
    inf = math.inf
    # resources
    tcp = unfair > 0
    snin = sim.res("srv_nic_in", S, fifo=fifo, weighted=tcp)
    snout = sim.res("srv_nic_out", S, fifo=fifo, weighted=tcp)
    sio = sim.res("srv_io", S)
    sfront = sim.res("srv_front", S)
    sapply = sim.res("srv_apply", S * apply_threads)  # threads own chunk ranges: one update uses all
    host = sim.res("host", colocate_cores, 1) if colocate_cores else None
    wup = [sim.res(f"w{g}_up", m) for g, m in enumerate(mult)]
    wdn = [sim.res(f"w{g}_dn", m) for g, m in enumerate(mult)]
    wcpu = [sim.res(f"w{g}_cpu", m) for g, m in enumerate(mult)]
    wio = [sim.res(f"w{g}_io", m) for g, m in enumerate(mult)]

    Bd = 4.0 * params
    push_b = Bd * (c["gddr_push_ratio"] if gddr else 1.0)
    pull_b = Bd * (c["q8_pull_ratio"] if q8 else 1.0)
    wire_up, wire_dn = push_b * overhead, pull_b * overhead

    def cpu(d, r):
        """a CPU demand on resource r, and on the shared host if any"""
        out = [(r, d)]
        if host is not None:
            out.append((host, d))
        return out

    def nic(b, L):
        return 0.0 if L == inf else b / L

    # demands of each stage (seconds of one unit of the resource, per worker)
    pack = cpu(S * c["cli_rt_s"] + (params * c["cli_gddr_per_float"] if gddr else 0.0), None)
    push_srv = ([(snin, nic(wire_up, Ls))] + cpu(push_b * c["srv_io_per_byte"], sio)
                + cpu(push_b * c["srv_val_per_byte"] + S * c["srv_rt_s"], sfront))
    upd = cpu(push_b * c["srv_apply_per_byte"], sapply)
    pull_srv = ([(snout, nic(wire_dn, Ls))] + cpu(pull_b * c["srv_io_per_byte"], sio)
                + cpu(S * c["srv_rt_s"] + (params * c["srv_q8_per_float"] if q8 else 0.0),
                      sfront))
    decode = cpu(S * c["cli_rt_s"]
                 + params * (c["cli_q8_per_float"] if q8 else c["cli_pull_per_float"]), None)
    # the optimizer's update of a sync step: every shard once (P/S floats a server)
    sync_update = cpu(Bd * c["srv_apply_per_byte"], sapply)

    def withres(dem, r):
        return [(r if x is None else x, d) for x, d in dem]

    ends = [[] for _ in range(G)]
    state = {"arrived": 0, "waiting": [], "step": 0}

    def tcpw():
        return float(rng.lognormal(0.0, unfair)) if unfair else 1.0

    def start(g):
        tc = compute_ms * 1e-3 * float(rng.lognormal(0.0, jitter)) if jitter else compute_ms * 1e-3
        if host is not None:
            sim.flow([(host, tc), (wcpu[g], tc)], mult[g], lambda: do_pack(g))
        else:
            sim.timer(tc, lambda: do_pack(g))

    def do_pack(g):
        sim.flow(withres(pack, wcpu[g]), mult[g], lambda: do_push(g))

    def do_push(g):
        d = ([(wup[g], nic(wire_up, Lw))] + cpu(push_b * c["cli_io_per_byte"], wio[g]) + push_srv)
        sim.flow(withres(d, wcpu[g]), mult[g], lambda: pushed(g), weight=tcpw())

    def pushed(g):
        if mode == "async":
            sim.flow(upd, mult[g], lambda: do_pull(g))
        else:
            sim.flow(upd, mult[g], lambda: summed(g))

    def summed(g):
        state["arrived"] += mult[g]
        state["waiting"].append(g)
        if state["arrived"] == W:
            state["arrived"] = 0
            waiting, state["waiting"] = state["waiting"], []
            sim.flow(sync_update, 1, lambda: [do_pull(x) for x in waiting])

    def do_pull(g):
        d = ([(wdn[g], nic(wire_dn, Lw))] + cpu(pull_b * c["cli_io_per_byte"], wio[g]) + pull_srv)
        sim.flow(withres(d, wcpu[g]), mult[g], lambda: sim.flow(withres(decode, wcpu[g]), mult[g],
                                                                lambda: done(g)), weight=tcpw())

    def done(g):
        ends[g].append(sim.t)
        if len(ends[g]) < steps + 1:
            start(g)

    for g in range(G):
        start(g)
    sim.run(lambda: all(len(e) >= steps + 1 for e in ends))
    # mean step time per worker over steps 2..steps+1 (the first fills the pipe)
    per = [(e[steps] - e[0]) / steps for e in ends]
    t = float(np.average(per, weights=mult))
    if detail:
        # busy share of each kind of resource over the run (servers: all S;
        # workers: the mean over workers)
        util = {}
        for name, i in sim.names.items():
            kind = name.split("_", 1)[1] if name.startswith("w") else name
            kind = {"up": "worker_nic_up", "dn": "worker_nic_down", "cpu": "worker_cpu",
                    "io": "worker_io"}.get(kind, kind)
            u = sim.work[i] / (sim.cap[i] * sim.t)
            util.setdefault(kind, []).append(u)
        util = {k: float(np.mean(v)) for k, v in util.items()}
        return t, util
    return t


# ---- validation: the measured step times --------------------------------------
# docs/network.md (runs 2-4 and run 1, NETROW lines in docs/network-data/):
# 4 workers and gddr-ps on this 2-core machine in two network namespaces,
# one veth rate-limited each way (tc tbf): the workers share that link, so
# it is the server's NIC in the model and the workers' own NICs are
# unlimited. Model: 1,017,610 floats; compute ~30 ms a gradient
# (MLP 784-1280-10, batch 128: net_compute_ms above). Loopback:
# scale-measure's walls (one client, no NIC at all).
NET_P = 1017610
VALIDATION = [
    # (label, mode, link gbit, gddr, q8, measured ms, source)
    ("100 Mbit/s sync dense", "sync", 0.1, False, False, 2477, "network.md run 2"),
    ("100 Mbit/s sync q8", "sync", 0.1, False, True, 1680, "network.md run 2"),
    ("100 Mbit/s sync gddr-q8", "sync", 0.1, True, True, 1092, "network.md run 2"),
    ("100 Mbit/s sync gddr-both (lazy pulls 0.6)", "sync", 0.1, True, "lazy", 1504, "network.md run 1"),
    ("100 Mbit/s sync dense, run 1", "sync", 0.1, False, False, 2473, "network.md run 1"),
    ("100 Mbit/s async dense", "async", 0.1, False, False, 1770, "network.md run 2"),
    ("100 Mbit/s async dense, run 1", "async", 0.1, False, False, 1821, "network.md run 1"),
    ("100 Mbit/s async gddr-both (lazy pulls 0.6)", "async", 0.1, True, "lazy", 1059,
     "network.md run 1"),
    ("100 Mbit/s async q8", "async", 0.1, False, True, 1397, "network.md run 2"),
    ("100 Mbit/s async gddr-q8", "async", 0.1, True, True, 857, "network.md run 2"),
    ("1 Gbit/s sync dense", "sync", 1.0, False, False, 238, "network.md run 4"),
    ("1 Gbit/s sync gddr-q8", "sync", 1.0, True, True, 131, "network.md run 4"),
    ("1 Gbit/s async dense", "async", 1.0, False, False, 152, "network.md run 4"),
    ("1 Gbit/s async gddr-q8", "async", 1.0, True, True, 87, "network.md run 4"),
]
LOOPBACK = [
    # (label, floats, gddr, q8, measured wall us: median of scale-measure's 6 runs)
    ("loopback 4 KiB dense", 1024, False, False, 259),
    ("loopback 16 MiB dense", 4194304, False, False, 30640),
    ("loopback 16 MiB gddr", 4194304, True, False, 31840),
    ("loopback 16 MiB q8", 4194304, False, True, 44300),
    ("loopback 16 MiB gddr-q8", 4194304, True, True, 54300),
    # gddr-bench --sections pushpull --sizes 4K,64K,1M,16M --reps 5 --budget-mb 64
    # (docs/scale-data/bench-pushpull.txt): us a gddr_push + gddr_pull, another
    # program and another run than the constants came from
    ("gddr-bench push+pull 4 KiB", 1024, False, False, 196),
    ("gddr-bench push+pull 64 KiB", 16384, False, False, 252),
    ("gddr-bench push+pull 1 MiB", 262144, False, False, 898),
    ("gddr-bench push+pull 16 MiB", 4194304, False, False, 24503),
]
TOLERANCE = 0.20


def validate(quiet=False, unfair=None):
    rows = []
    for label, mode, gb, gddr, q8, meas, src in VALIDATION:
        const = CONST
        if q8 == "lazy":   # run 1: GDDR on pulls too, 0.6 of the pull bytes, no encode cost
            const = dict(CONST, q8_pull_ratio=0.60, srv_q8_per_float=0.0,
                         cli_q8_per_float=CONST["cli_pull_per_float"])
            q8 = True
        t = simulate(4, 1, mode, params=NET_P, gbit=math.inf, server_gbit=gb,
                     compute_ms=CONST["net_compute_ms"], gddr=gddr, q8=q8, apply_threads=2,
                     groups=4, steps=30, overhead=CONST["overhead_veth"], colocate_cores=2,
                     unfair=unfair, const=const)
        rows.append((label, meas, t * 1e3, src))
    for label, n, gddr, q8, meas in LOOPBACK:
        t = simulate(1, 1, "async", params=n, gbit=math.inf, compute_ms=0.0, gddr=gddr, q8=q8,
                     apply_threads=2, groups=1, steps=3, jitter=0.0, colocate_cores=2)
        rows.append((label, meas / 1e3, t * 1e3,
                     "gddr-bench" if label.startswith("gddr-bench") else "scale-measure.sh (A)"))
    if not quiet:
        print("| setting | measured ms | model ms | error | source |")
        print("|---|---|---|---|---|")
        for label, m, p, src in rows:
            print(f"| {label} | {m:.4g} | {p:.4g} | {100 * (p - m) / m:+.0f}% | {src} |")
    return rows


# ---- the sweep for the plot ----------------------------------------------------
def sweep(out, params, compute_ms, gbits, servers, workers, modes):
    """dense; GDDR both ways (alpha 0.4 pushes, 8-bit delta pulls) as measured
    here; GDDR pushes with dense pulls; the same with the client's GDDR
    passes free (a what-if: the device step on a GPU, not measured)."""
    dev = dict(CONST, cli_gddr_per_float=0.0)
    with open(out, "w") as f:
        f.write("# params compute_ms mode gbit S W dense_ms gddr_ms gddr_push_ms "
                "gddr_push_dev_ms bound_dense bound_gddr\n")
        for mode in modes:
            for gb in gbits:
                for S in servers:
                    for W in workers:
                        a = dict(compute_ms=compute_ms, steps=3)
                        d, ud = simulate(W, S, mode, params, gb, detail=True, **a)
                        g, ug = simulate(W, S, mode, params, gb, gddr=True, detail=True, **a)
                        gp = simulate(W, S, mode, params, gb, gddr=True, q8=False, **a)
                        gv = simulate(W, S, mode, params, gb, gddr=True, q8=False, const=dev, **a)
                        f.write(f"{params:.0f} {compute_ms} {mode} {gb:g} {S} {W} {d * 1e3:.1f} "
                                f"{g * 1e3:.1f} {gp * 1e3:.1f} {gv * 1e3:.1f} "
                                f"{max(ud, key=ud.get)} {max(ug, key=ug.get)}\n")
                        f.flush()
                    f.write("\n\n")


def servers_needed(W, mode, params, gbit, compute_ms, gddr, q8=None, const=CONST):
    """S = 1, 2, 4, ... 2W: the step time and what bounds it; the fewest
    servers whose step is within 10% of the best."""
    rows = []
    S = 1
    while S <= 2 * W:
        t, u = simulate(W, S, mode, params, gbit, compute_ms=compute_ms, gddr=gddr, q8=q8,
                        steps=3, detail=True, const=const)
        rows.append((S, t, max(u, key=u.get), u))
        S *= 2
    best = min(r[1] for r in rows)
    need = next(r[0] for r in rows if r[1] <= 1.1 * best)
    return need, rows


# ---- the quick test --------------------------------------------------------------
def check():
    t0 = time.time()
    ok = True

    def claim(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok &= bool(cond)

    # step time non-decreasing in W at fixed S when the servers bound it
    # (one server, 10 Gbit/s, 25M floats: the server carries W copies)
    for mode in ("sync", "async"):
        for gddr in (False, True):
            ts, bound = [], []
            for W in (8, 16, 32, 64):
                t, u = simulate(W, 1, mode, 25e6, 10, compute_ms=50, gddr=gddr, steps=3,
                                jitter=0.0, unfair=0.0, detail=True)
                ts.append(t)
                bound.append(max(u, key=u.get))
            claim(all(b.startswith("srv") for b in bound)
                  and all(b >= a * 0.999 for a, b in zip(ts, ts[1:])),
                  f"{mode} {'gddr' if gddr else 'dense'}: S=1, bound by {sorted(set(bound))}, "
                  "step time non-decreasing in W: " + ", ".join(f"{x * 1e3:.0f}" for x in ts) + " ms")
    # GDDR never slower than dense when a link bounds the step (the dense run's
    # busiest resource is a NIC)
    for mode in ("sync", "async"):
        for W, S, gb, P in ((8, 1, 1, 25e6), (64, 4, 1, 25e6), (256, 64, 1, 25e6),
                            (16, 16, 1, 340e6), (64, 64, 0.1, 25e6)):
            d, u = simulate(W, S, mode, P, gb, compute_ms=50, steps=3, jitter=0.0, unfair=0.0,
                            detail=True)
            g = simulate(W, S, mode, P, gb, compute_ms=50, gddr=True, steps=3, jitter=0.0,
                         unfair=0.0)
            b = max(u, key=u.get)
            claim("nic" in b and g <= d * 1.001,
                  f"{mode}: W={W} S={S} {gb:g} Gbit/s {P / 1e6:.0f}M: bound by {b}, "
                  f"GDDR {g * 1e3:.0f} ms <= dense {d * 1e3:.0f} ms")
    # a link-bound step is at least the bytes over the server's NIC, and near it
    d = simulate(8, 1, "sync", 25e6, 1, compute_ms=0, steps=3, jitter=0.0, unfair=0.0)
    floor = 8 * 2 * 4 * 25e6 * CONST["overhead_nic"] / (1e9 / 8)
    claim(floor <= d <= 1.3 * floor, f"sync W=8 S=1 1 Gbit/s: {d:.2f} s within 1.3x of the "
          f"server NIC's {floor:.2f} s")
    rows = validate(quiet=True)
    for label, m, p, src in rows:
        if not src.startswith("network"):
            continue   # loopback rows: shown by --validate, not the target (docs/scale.md)
        claim(abs(p - m) / m <= TOLERANCE,
              f"validation {label}: model {p:.4g} ms vs measured {m:.4g} ms "
              f"({100 * (p - m) / m:+.0f}%, tolerance {TOLERANCE:.0%})")
    print(f"scalesim --check: {'ok' if ok else 'FAILED'} in {time.time() - t0:.1f} s")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--unfair", type=float, help="TCP's unequal sharing (default: tcp_unfair)")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--servers-needed", action="store_true",
                    help="for -W: the step time for S = 1, 2, 4, ... 2W and what bounds it")
    ap.add_argument("--variant", default="dense", choices=("dense", "gddr", "gddr-push"))
    ap.add_argument("--out", default="docs/scale-data/sweep.dat")
    ap.add_argument("-W", "--workers", type=int, default=64)
    ap.add_argument("-S", "--servers", type=int, default=8)
    ap.add_argument("--mode", default="sync", choices=("sync", "async"))
    ap.add_argument("--params", type=float, default=25e6)
    ap.add_argument("--gbit", type=float, default=25.0)
    ap.add_argument("--server-gbit", type=float)
    ap.add_argument("--compute-ms", type=float, default=100.0)
    ap.add_argument("--apply-threads", type=int, default=4)
    ap.add_argument("--gddr", action="store_true", help="GDDR pushes and 8-bit delta pulls")
    ap.add_argument("--sweep-gbits", default="10,25,100")
    ap.add_argument("--sweep-servers", default="1,4,16,64")
    ap.add_argument("--sweep-workers", default="8,16,32,64,128,256,512,1024")
    ap.add_argument("--sweep-modes", default="sync,async")
    a = ap.parse_args()
    if a.check:
        sys.exit(0 if check() else 1)
    if a.validate:
        validate(unfair=a.unfair)
        return
    if a.sweep:
        sweep(a.out, a.params, a.compute_ms, [float(x) for x in a.sweep_gbits.split(",")],
              [int(x) for x in a.sweep_servers.split(",")],
              [int(x) for x in a.sweep_workers.split(",")], a.sweep_modes.split(","))
        return
    if a.servers_needed:
        gddr = a.variant != "dense"
        q8 = {"dense": False, "gddr": True, "gddr-push": False}[a.variant]
        need, rows = servers_needed(a.workers, a.mode, a.params, a.gbit, a.compute_ms, gddr, q8)
        print(f"W={a.workers} {a.mode} {a.variant} {a.params / 1e6:g}M floats {a.gbit:g} Gbit/s "
              f"compute {a.compute_ms:g} ms: {need} servers are within 10% of the best")
        print("| S | step ms | bound | busy: srv io / srv front / srv NIC in / worker NIC up |")
        print("|---|---|---|---|")
        for S, t, b, u in rows:
            print(f"| {S} | {t * 1e3:.0f} | {b} | {u['srv_io']:.2f} / {u['srv_front']:.2f} / "
                  f"{u['srv_nic_in']:.2f} / {u['worker_nic_up']:.2f} |")
        return
    for g in (False, True):
        t = simulate(a.workers, a.servers, a.mode, a.params, a.gbit, a.server_gbit, a.compute_ms,
                     gddr=g, apply_threads=a.apply_threads)
        print(f"{'gddr' if g else 'dense'}: {t * 1e3:.1f} ms a step")


if __name__ == "__main__":
    main()
