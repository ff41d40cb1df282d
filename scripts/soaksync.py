#!/usr/bin/python3
"""soaksync.py -- the soak (scripts/soak.py) in sync mode: faults for a while
against a sharded pair of gddr-ps whose workers step together, and whether
the steps went on (docs/soak.md, "Sync mode").

    make soak-sync                     # 10 minutes (SOAK_SYNC_S)
    scripts/soaksync.py --seconds 120 --push-log always

In sync mode a step completes only when every live worker has pushed it,
so every worker pushes the same tensors: W conservation workers (this
file, --worker), each stepping K tensors with a gradient of -1 and lr 1
(gddr_step: push, then wait for the step's version). The faults are those
of soak.py: kill -9 of a server (restarted from its checkpoint_dir), a
server killed while it writes a checkpoint, SIGSTOP of a server, kill -9
of a worker (started again: it joins the steps again), SIGSTOP of a
worker, and malformed messages.

What it checks, at the end:
  - liveness: once the faults stop, every worker completes --progress
    steps within --progress-s (a step that never completes -- a lost push
    that nobody resends, a dead worker still counted -- fails it);
  - no torn step: every value of a tensor is the same, in each worker's
    parameters after every step and on the servers at the end (every
    push is -1 everywhere, so a step half applied shows);
  - no unplanned exit of a server, and no worker that gave up.
--trainers runs gddr-train workers instead (the MLP, GDDR pushes, 8-bit
delta pulls): progress is then counted in the servers' versions, and the
model the servers keep is scored at the end; --server-set passes a
setting to both servers (kind=adam lr=0.001, momentum=0.9, ...).
What a step adds is not checked against a count: a step divides by the
workers that took part in it, and a push that comes after its step
completed (from a worker that was stopped) joins the next one, so a value
is not the number of steps (server/sync.c).
Exit status 0 when all three hold.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import soak
from soak import BIN, Server, keygen, log, malformed, percentile, stop_proc


def worker(args):
    """Steps K tensors with -1 until the stop file appears; a line per step
    in the steps file; at the end, a JSON account."""
    sys.path.insert(0, os.path.join(soak.ROOT, "python"))
    os.environ.setdefault("GDDR_LIB", os.path.join(BIN, "..", "lib", "libgddr-client.so"))
    import numpy as np
    import gddr
    c = gddr.Client(args.servers, rank=args.rank, world_size=args.world, timeout_ms=3000,
                    reconnect_timeout_ms=600000, heartbeat_ms=500,
                    curve_server_key=args.server_key, curve_key_file=args.key_file)
    n = 4096
    ts = [c.register("sync.%d" % k, np.zeros(n, np.float32), optimizer="sgd lr=1")
          for k in range(args.tensors)]
    grads = [-np.ones(n, np.float32) for _ in ts]
    params = [np.zeros(n, np.float32) for _ in ts]
    # A sparse table stepped alongside (--rows): every worker pushes -1 to
    # the same rows each step, so every value of a row is alike.
    tb = c.register_table("sync.rows", 8, optimizer="sgd lr=1") if args.rows else None
    keys = np.arange(args.rows, dtype=np.uint64)
    rgrad = -np.ones((args.rows, 8), np.float32)
    torn, errors, ok = [], 0, 0
    steps = open(args.steps_file, "a", buffering=1)
    while not os.path.exists(args.stop_file):
        try:
            c.step(grads, params)
            if tb:
                tb.push(keys, rgrad)
                rows = tb.pull(keys)
                # (rows on two shards may differ: a restart takes one
                # shard's steps back; a row's own values may not)
                bad = np.nonzero(rows.min(axis=1) != rows.max(axis=1))[0]
                if bad.size and len(torn) < 20:
                    torn.append({"table": "sync.rows", "step": ok, "row": int(bad[0]),
                                 "min": float(rows[bad[0]].min()), "max": float(rows[bad[0]].max())})
        except gddr.Error as e:
            errors += 1
            steps.write("%.6f err %s\n" % (time.time(), str(e).replace("\n", " ")))
            time.sleep(0.1)
            continue
        ok += 1
        steps.write("%.6f ok\n" % time.time())
        for k, p in enumerate(params):
            if not np.all(p == p[0]) and len(torn) < 20:
                torn.append({"tensor": k, "step": ok, "min": float(p.min()), "max": float(p.max())})
    final = []
    if args.rank == 0:
        for k, t in enumerate(ts):
            out = np.zeros(n, np.float32)
            for _ in range(60):
                try:
                    c.pull(t, out)
                    break
                except gddr.Error:
                    time.sleep(1)
            final.append([int(c.version(t)), float(out.min()), float(out.max())])
            if out.min() != out.max():
                torn.append({"tensor": k, "final": True, "min": float(out.min()), "max": float(out.max())})
    c.close()
    json.dump({"steps": ok, "errors": errors, "torn": torn, "final": final}, open(args.result_file, "w"))
    return 0


class Stepper(soak.Worker):
    """One conservation worker of the sync soak, run again after a kill."""

    def __init__(self, rank, tmp, eps, keys, world, stop_file, rows=0):
        self.steps_file = os.path.join(tmp, "sync%d.steps" % rank)
        self.result_file = os.path.join(tmp, "sync%d.json" % rank)
        argv = [sys.executable, os.path.abspath(__file__), "--worker", "--rows", str(rows), "--servers", eps,
                "--rank", str(rank), "--world", str(world), "--server-key=" + keys["server_pub"],
                "--key-file", os.path.join(tmp, "client.key"), "--stop-file", stop_file,
                "--steps-file", self.steps_file, "--result-file", self.result_file]
        super().__init__(rank, argv, tmp)

    def oks(self, since):
        try:
            return [float(ln.split()[0]) for ln in open(self.steps_file)
                    if ln.split()[1:2] == ["ok"] and float(ln.split()[0]) > since]
        except OSError:
            return []


class Trainer(soak.Worker):
    """A gddr-train rank of the sync soak (--trainers): the MLP with GDDR
    pushes and 8-bit delta pulls, run again when it finishes or is killed.
    Its steps are counted on the servers (gddr_versions_total)."""

    def __init__(self, rank, tmp, eps, keys, world):
        argv = [os.path.join(BIN, "gddr-train"), "--server", eps, "--rank", str(rank),
                "--world", str(world), "--workload", "mlp", "--steps", "3000", "--seed", str(rank + 1),
                "--delay-fraction", "0.4", "--pull-delta-bits", "8", "--progress", "0",
                "--opt", "curve_server_key=" + keys["server_pub"],
                "--opt", "curve_key_file=" + os.path.join(tmp, "client.key")] + soak.data_args()
        super().__init__(rank, argv, tmp)
        self.result_file = None


def versions(servers, env):
    """gddr_versions_total over the servers (None when one does not answer)."""
    total = 0
    for s in servers:
        r = subprocess.run([os.path.join(BIN, "gddr-ctl"), "-s", s.endpoint, "metrics"], capture_output=True,
                           text=True, env=env, timeout=30)
        v = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("gddr_versions_total ")]
        if not v:
            return None
        total += int(float(v[0]))
    return total


def run(args):
    tmp = tempfile.mkdtemp(prefix="gddr-soaksync.")
    keys = keygen(tmp)
    with open(os.path.join(tmp, "authorized_keys"), "w") as f:
        f.write(keys["client_pub"] + "\n")
    sets = ["mode=sync", "workers=%d" % args.workers, "log_level=" + args.log_level,
            "checkpoint_interval_s=%g" % args.ckpt_interval, "worker_timeout_s=3",
            "sync_stall_s=10",  # the stall net, at the scale of worker_timeout_s here
            "curve_secret_key_file=" + os.path.join(tmp, "server.key"),
            "authorized_keys=" + os.path.join(tmp, "authorized_keys")]
    if args.push_log != "off":
        sets.append("push_log=" + args.push_log)
    if args.trainers:
        sets.append("lr=0.1")
    sets += args.server_set
    servers = [Server(i, tmp, sets) for i in range(2)]
    for s in servers:
        s.start()
    eps = ",".join(s.endpoint for s in servers)
    stop_file = os.path.join(tmp, "stop")
    if args.trainers:
        workers = [Trainer(r, tmp, eps, keys, args.workers) for r in range(args.workers)]
    else:
        workers = [Stepper(r, tmp, eps, keys, args.workers, stop_file, args.rows)
                   for r in range(args.workers)]
    for w in workers:
        w.start()
    log("sync soak: 2 servers (%s), %d workers, %s s, push_log %s; files in %s" % (
        eps, args.workers, args.seconds, args.push_log, tmp))
    rnd = random.Random(args.seed)
    stop = threading.Event()
    counts = {"sent": 0, "dropped": 0}
    threading.Thread(target=malformed, args=([s.endpoint for s in servers], keys, stop, counts),
                     daemon=True).start()
    events = {"server_kill": 0, "server_kill_in_checkpoint": 0, "server_stop": 0,
              "worker_kill": 0, "worker_stop": 0}
    kills, pending = [], []   # [monotonic, wall, restart wall] per server kill; (due, action)
    end = time.monotonic() + args.seconds
    next_event = time.monotonic() + rnd.uniform(3, 6)
    last_kill = 0.0
    ctl_env = soak.ctl_env_of(keys, tmp)
    while time.monotonic() < end:
        now = time.monotonic()
        soak.tend(servers, workers, pending, kills, now)
        if now >= next_event:
            next_event = now + rnd.uniform(args.gap * 0.5, args.gap * 1.5)
            last_kill = soak.fault(rnd, args, servers, workers, pending, events, kills, ctl_env, now, last_kill)
        time.sleep(0.2)
    stop.set()
    for _, act in pending:
        soak.do_action(act, kills)
    for s in servers:
        if s.reap():
            s.start()
    for w in workers:
        w.check(restart=True)
    calm = time.time()
    deadline = time.monotonic() + args.progress_s
    if args.trainers:
        # Every step of every trainer makes one version of each of its
        # tensors on the servers: they must keep coming.
        log("faults stop; the servers must now make %d versions within %g s" % (
            args.progress, args.progress_s))
        v0 = None
        while v0 is None and time.monotonic() < deadline:
            v0 = versions(servers, ctl_env)
        v1 = v0
        while v0 is not None and time.monotonic() < deadline and (v1 or 0) - v0 < args.progress:
            for w in workers:
                w.check(restart=True)
            time.sleep(0.5)
            v1 = versions(servers, ctl_env)
        progress = [(v1 or 0) - (v0 or 0)]
        if progress[0] < args.progress:
            hang_report(tmp, servers, workers, ctl_env)
        acc = soak.evaluate(eps, keys, tmp, soak.data_args())
        for w in workers:
            if w.proc and w.proc.poll() is None:
                stop_proc(w, 30)
            w.check(restart=False)
        stop_servers(servers)
        return account(args, tmp, servers, workers, kills, events, counts, progress, acc)
    log("faults stop; every worker must now complete %d steps within %g s" % (args.progress, args.progress_s))
    while time.monotonic() < deadline and min(len(w.oks(calm)) for w in workers) < args.progress:
        for w in workers:
            w.check(restart=False)
        time.sleep(0.5)
    progress = [len(w.oks(calm)) for w in workers]
    hung = min(progress) < args.progress
    if hung:
        hang_report(tmp, servers, workers, ctl_env)
    open(stop_file, "w").close()
    for w in workers:
        try:
            w.proc and w.proc.wait(5 if hung else 120)  # a hung worker does not see the stop file
        except subprocess.TimeoutExpired:
            stop_proc(w, 10)
        w.check(restart=False)
    stop_servers(servers)
    return account(args, tmp, servers, workers, kills, events, counts, progress, None)


def stop_servers(servers):
    for s in servers:
        stop_proc(s, 30)
        s.planned = True
        s.reap()


def hang_report(tmp, servers, workers, env):
    """What the servers count and where each worker waits, for a hang."""
    log("steps stopped: the servers' metrics and the workers' stacks go to %s/hang-*.txt" % tmp)
    for s in servers:
        with open(os.path.join(tmp, "hang-ps%d.txt" % s.i), "w") as f:
            subprocess.run([os.path.join(BIN, "gddr-ctl"), "-s", s.endpoint, "metrics"], stdout=f,
                           stderr=subprocess.STDOUT, env=env, timeout=30)
    for w in workers:
        if w.proc and w.proc.poll() is None:
            with open(os.path.join(tmp, "hang-w%d.txt" % w.rank), "w") as f:
                try:
                    subprocess.run(["gdb", "-p", str(w.proc.pid), "-batch", "-ex", "thread apply all bt"],
                                   stdout=f, stderr=subprocess.STDOUT, timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    pass


def account(args, tmp, servers, workers, kills, events, counts, progress, acc):
    results = []
    for w in workers:
        try:
            results.append(json.load(open(w.result_file)) if w.result_file else {"torn": [], "errors": 0,
                                                                                 "final": None})
        except (OSError, ValueError):
            results.append(None)
    torn = [t for r in results if r for t in r["torn"]]
    unplanned = [u for s in servers for u in s.unplanned] + [u for w in workers for u in w.unplanned]
    unplanned += ["worker %d left no account" % w.rank for w, r in zip(workers, results) if r is None]
    oks = sorted(t for w in workers if w.result_file for t in w.oks(0))
    rec = []
    for _, t_kill, _ in kills:
        after = [t for t in oks if t > t_kill]
        if after:
            rec.append(after[0] - t_kill)
    steps = sum(len(w.oks(0)) for w in workers if w.result_file) if not args.trainers else "-"
    errors = sum(r["errors"] for r in results if r)
    ok = not torn and not unplanned and min(progress) >= args.progress
    rep = {"seconds": args.seconds, "push_log": args.push_log, "events": events,
           "malformed_sent": counts["sent"], "worker_steps": steps, "step_errors": errors,
           "progress_after_faults": progress, "torn": torn, "unplanned_exits": unplanned,
           "final": results[0]["final"] if results and results[0] else None,
           "recovery_from_kill_s": {"median": statistics.median(rec) if rec else None,
                                    "p95": percentile(rec, 0.95) if rec else None, "n": len(rec)},
           "accuracy": acc, "ok": ok, "tmp": tmp}
    print("\n## sync soak: %d s, %d workers, push_log %s\n" % (args.seconds, args.workers, args.push_log))
    print("| | |\n|---|---|")
    print("| steps completed (all workers) | %s, %d failed calls |" % (steps, errors))
    print("| faults | %s; %d malformed messages |" % (
        ", ".join("%s %d" % kv for kv in events.items()), counts["sent"]))
    r = rep["recovery_from_kill_s"]
    if not args.trainers:
        print("| a server kill to the next step (s) | median %s, p95 %s over %d kills |" % (
            soak.fmt(r["median"]), soak.fmt(r["p95"]), r["n"]))
    print("| %s once the faults stopped | %s (at least %d within %g s) |" % (
        "versions on the servers" if args.trainers else "steps per worker", progress, args.progress,
        args.progress_s))
    if args.trainers:
        print("| the servers' model, test accuracy | %s |" % acc)
    if not args.trainers:
        print("| final versions, values (tensor: version, min, max) | %s |" % rep["final"])
    print("| torn | %s |" % (torn or "none"))
    print("| unplanned exits | %d |" % len(unplanned))
    for u in unplanned:
        print("  - " + u)
    print("\nsync soak: %s (files in %s)" % ("OK" if ok else "FAILED", tmp))
    if args.json:
        json.dump(rep, open(args.json, "w"), indent=1)
    return rep


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SYNC_S", 600)))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--ckpt-interval", type=float, default=5.0)
    p.add_argument("--push-log", default="off", choices=["off", "batch", "always"])
    p.add_argument("--gap", type=float, default=4.0, help="mean seconds between faults")
    p.add_argument("--server-kill-gap", type=float, default=15.0)
    p.add_argument("--progress", type=int, default=20,
                   help="steps every worker must complete once the faults stop")
    p.add_argument("--progress-s", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-level", default="info")
    p.add_argument("--server-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a gddr-ps setting for both servers (repeatable; e.g. kind=adam lr=0.001)")
    p.add_argument("--rows", type=int, default=0,
                   help="also step a sparse table of this many rows (0: none). Known to stop: "
                        "docs/soak.md, 'Sync mode with a table'")
    p.add_argument("--trainers", action="store_true",
                   help="gddr-train workers (MLP, GDDR pushes, delta pulls) instead of the constant ones: "
                        "progress counted in the servers' versions, and the model scored at the end")
    p.add_argument("--json", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for a in ("--servers", "--server-key", "--key-file", "--stop-file", "--steps-file", "--result-file"):
        p.add_argument(a, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tensors", type=int, default=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.kill_servers = [0, 1]
    if args.worker:
        return worker(args)
    return 0 if run(args)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
