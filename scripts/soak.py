#!/usr/bin/python3
"""soak.py -- faults for a long while against a sharded pair of gddr-ps,
and an account of what survived them (docs/soak.md).

    make soak                          # an hour (SOAK_S, default 3600)
    SOAK_S=180 scripts/soak.py         # the short version make check runs
    scripts/soak.py --seconds 600 --baseline --push-log always

The setup: two gddr-ps holding one model sharded between them, CURVE on,
async, checkpoints every few seconds; eight gddr-train workers (the MLP on
Fashion-MNIST, GDDR alpha 0.4 on pushes, 8-bit delta pulls), each run again
when it finishes; and one conservation worker (this file, --conserve) that
pushes a gradient of -1 with lr 1 to a few tensors of its own, so that a
tensor's value and its version both count the pushes applied to it.

While it runs, at random: kill -9 of a server (restarted on its endpoint
from its checkpoint_dir after 0.5-3 s), a checkpoint asked for and the
server killed while writing it, SIGSTOP of a server for 1-8 s, kill -9 of a
worker (started again), SIGSTOP of a worker, and a stream of malformed
messages from CURVE clients and from plain TCP ones.

At the end it prints, and writes as JSON (--json):
  - pushes acknowledged to the conservation worker, applied (the final
    versions), lost (the versions a restart took back, each attributed to
    the kill it followed) and unaccounted (acknowledged - applied - lost:
    must be 0; a double apply or a silent loss makes it non-zero), and
    whether every tensor's values equal its version (no torn update);
  - duplicate pushes the servers answered as resends;
  - recovery: from each server kill to the conservation worker's next
    completed step, median and p95, and from the restart; the push log's
    replay time at each restart (its share of the recovery);
  - unplanned exits (servers that died without being killed, workers that
    gave up), each with the last line it printed;
  - RSS and open files of each server over the second half of each life
    that lasted 60 s or more (server 1 is only ever stopped, never killed,
    so it lives the whole run: --kill-servers);
  - the accuracy of the model the servers keep at the end (an observer),
    and with --baseline that of an undisturbed run of the same length.
Exit status 0 when nothing was unaccounted, no value was torn, nothing
exited unplanned and (with --max-rss-growth) RSS stayed within bounds.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("GDDR_BIN", os.path.join(ROOT, "build", "bin"))
if not os.path.isabs(BIN):
    BIN = os.path.join(ROOT, BIN)
FMNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def data_args():
    """gddr-train's data: Debian's Fashion-MNIST, or synthetic without it."""
    return [] if os.path.exists(FMNIST) else ["--synthetic", "20000"]


def log(msg):
    print("[soak %7.1f] %s" % (time.monotonic() - T0, msg), flush=True)


T0 = time.monotonic()


# ---- the conservation worker (a process of its own) ------------------------

def conserve(args):
    """Pushes -1 with lr 1 to K tensors until the stop file appears; writes
    a line per step (time, ok or the error) and, at the end, a JSON
    account."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("GDDR_LIB", os.path.join(BIN, "..", "lib", "libgddr-client.so"))
    import numpy as np
    import gddr
    opts = dict(timeout_ms=3000, reconnect_timeout_ms=args.reconnect_ms, heartbeat_ms=500,
                curve_server_key=args.server_key, curve_key_file=args.key_file)
    c = gddr.Client(args.servers, rank=args.rank, world_size=args.world, **opts)
    n = 4096
    ts = [c.register("conserve.%d" % k, np.zeros(n, np.float32), optimizer="sgd lr=1")
          for k in range(args.tensors)]
    g = -np.ones(n, np.float32)
    acked = [0] * len(ts)
    last = [0] * len(ts)
    lost = [0] * len(ts)
    errors = []
    steps = open(args.steps_file, "a", buffering=1)
    while not os.path.exists(args.stop_file):
        ok = True
        for k, t in enumerate(ts):
            try:
                v = c.push(t, g)
            except gddr.Error as e:
                ok = False
                errors.append("%.3f %s" % (time.time(), e))
                steps.write("%.6f err %s\n" % (time.time(), str(e).replace("\n", " ")))
                continue
            acked[k] += 1
            if v < last[k] + 1:
                # A restart took versions back: those pushes were lost with
                # the server (restored from an older checkpoint).
                lost[k] += last[k] + 1 - v
                steps.write("%.6f lost %d %d\n" % (time.time(), k, last[k] + 1 - v))
            last[k] = v
        if ok:
            steps.write("%.6f ok\n" % time.time())
        time.sleep(0.02)
    final, torn = [], []
    for k, t in enumerate(ts):
        out = np.zeros(n, np.float32)
        for attempt in range(60):
            try:
                c.pull(t, out)
                ver = c.version(t)
                break
            except gddr.Error:
                time.sleep(1)
        else:
            ver = -1
        final.append(int(ver))
        if not np.all(out == np.float32(ver)):
            torn.append({"tensor": k, "version": int(ver), "min": float(out.min()),
                         "max": float(out.max())})
    c.close()
    json.dump({"acked": acked, "lost": lost, "final_version": final, "torn": torn,
               "errors": errors[-20:], "n_errors": len(errors)},
              open(args.result_file, "w"))
    return 0


# ---- processes --------------------------------------------------------------

class Server:
    def __init__(self, i, tmp, sets):
        self.i, self.tmp, self.sets = i, tmp, sets
        self.dir = os.path.join(tmp, "ckpt%d" % i)
        os.makedirs(self.dir, exist_ok=True)
        self.logf = open(os.path.join(tmp, "ps%d.log" % i), "ab")
        self.endpoint = None
        self.proc = None
        self.lives = []      # [start, end, [(t, rss_kb, fds)]]
        self.planned = False
        self.unplanned = []

    def start(self):
        epf = os.path.join(self.tmp, "ep%d" % self.i)
        if os.path.exists(epf):
            os.unlink(epf)
        listen = self.endpoint or "tcp://127.0.0.1:*"
        cmd = [os.path.join(BIN, "gddr-ps"), "--listen", listen, "--endpoint-file", epf,
               "--set", "checkpoint_dir=" + self.dir,
               "--set", "shard_index=%d" % self.i, "--set", "shard_count=2"]
        for s in self.sets:
            cmd += ["--set", s]
        self.planned = False
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=self.logf)
        deadline = time.monotonic() + 30
        while not os.path.exists(epf):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("gddr-ps %d did not start (see %s)" % (self.i, self.logf.name))
            time.sleep(0.05)
        self.endpoint = open(epf).read().strip()
        self.lives.append([time.monotonic(), None, []])

    def signal(self, sig):
        if self.proc and self.proc.poll() is None:
            if sig == signal.SIGKILL:
                self.planned = True
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def reap(self):
        """Notes an exit nobody asked for; returns True when it is down."""
        if not self.proc or self.proc.poll() is None:
            return False
        if self.lives and self.lives[-1][1] is None:
            self.lives[-1][1] = time.monotonic()
            if not self.planned:
                self.unplanned.append("gddr-ps %d exited with %s: %s" % (
                    self.i, self.proc.returncode, last_line(self.logf.name)))
        return True

    def sample(self):
        if not self.proc or self.proc.poll() is not None:
            return
        try:
            rss = 0
            for line in open("/proc/%d/status" % self.proc.pid):
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
            fds = len(os.listdir("/proc/%d/fd" % self.proc.pid))
        except OSError:
            return
        self.lives[-1][2].append((time.monotonic(), rss, fds))


def stop_proc(p, wait_s):
    """SIGTERM, and SIGKILL when it has not exited within wait_s."""
    p.signal(signal.SIGTERM)
    try:
        p.proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        p.signal(signal.SIGKILL)
        p.proc.wait()


def last_line(path):
    try:
        lines = [ln for ln in open(path, errors="replace").read().splitlines() if ln.strip()]
        return lines[-1][-300:] if lines else ""
    except OSError:
        return ""


class Worker:
    """One gddr-train rank, run again each time it finishes."""

    def __init__(self, rank, argv, tmp):
        self.rank, self.argv, self.tmp = rank, argv, tmp
        self.proc = None
        self.planned = False
        self.runs = 0
        self.unplanned = []
        self.err = os.path.join(tmp, "w%d.err" % rank)

    def start(self):
        self.planned = False
        self.runs += 1
        with open(self.err, "ab") as e, open(os.path.join(self.tmp, "w%d.out" % self.rank), "ab") as o:
            self.proc = subprocess.Popen(self.argv, stdout=o, stderr=e)

    def signal(self, sig):
        if self.proc and self.proc.poll() is None:
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.planned = True
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def check(self, restart):
        """Notes an unplanned exit; starts the next run when asked."""
        if self.proc is None or self.proc.poll() is None:
            return
        rc = self.proc.returncode
        if rc != 0 and not self.planned:
            self.unplanned.append("worker %d (run %d) exited with %s: %s" % (
                self.rank, self.runs, rc, last_line(self.err)))
        self.proc = None
        if restart:
            self.start()


# ---- malformed traffic ------------------------------------------------------

def malformed(endpoints, keys, stop, counts):
    import zmq
    ctx = zmq.Context.instance()
    rnd = random.Random(7)
    while not stop.is_set():
        ep = rnd.choice(endpoints)
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDTIMEO, 200)
        curve = rnd.random() < 0.7
        if curve:
            s.curve_serverkey = keys["server_pub"].encode()
            s.curve_publickey = keys["client_pub"].encode()
            s.curve_secretkey = keys["client_sec"].encode()
        s.connect(ep)
        for _ in range(rnd.randint(20, 200)):
            kind = rnd.randrange(5)
            if kind == 0:
                frames = [os.urandom(rnd.randint(0, 64))]
            elif kind == 1:      # a header of random bytes and a payload
                frames = [os.urandom(rnd.randint(1, 40)), os.urandom(rnd.randint(0, 4096))]
            elif kind == 2:      # a protobuf-looking header: field 1 varint, junk after
                frames = [b"\x08" + os.urandom(rnd.randint(1, 30)), b"", os.urandom(16)]
            elif kind == 3:      # many frames
                frames = [os.urandom(8) for _ in range(rnd.randint(5, 40))]
            else:                # one large junk frame
                frames = [os.urandom(rnd.randint(65536, 1 << 20))]
            try:
                s.send_multipart(frames)
                counts["sent"] += 1
            except zmq.ZMQError:
                counts["dropped"] += 1
        s.close()
        stop.wait(rnd.uniform(0.2, 1.5))


# ---- the run ------------------------------------------------------------------

def keygen(tmp):
    for name in ("server", "client"):
        subprocess.run([os.path.join(BIN, "gddr-keygen"), os.path.join(tmp, name)], check=True,
                       stdout=subprocess.DEVNULL)

    def read(path):
        d = {}
        for line in open(path):
            if "=" in line and not line.startswith("#"):
                k, v = line.split("=", 1)
                d[k.strip()] = v.strip()
        return d
    srv, cli = read(os.path.join(tmp, "server.key")), read(os.path.join(tmp, "client.key"))
    return {"server_pub": srv["public"], "client_pub": cli["public"], "client_sec": cli["secret"]}


def do_action(act, kills):
    """A fault's second half: ("start", server[, kill index]) or ("cont", process)."""
    if act[0] == "start":
        act[1].start()
        if len(act) > 2:
            kills[act[2]][2] = time.time()
    else:
        act[1].signal(signal.SIGCONT)


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def evaluate(servers, keys, tmp, data):
    cmd = [os.path.join(BIN, "gddr-train"), "--evaluate", "--server", servers, "--workload", "mlp",
           "--opt", "curve_server_key=" + keys["server_pub"],
           "--opt", "curve_key_file=" + os.path.join(tmp, "client.key")] + data
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    for tok in r.stdout.split():
        if tok.startswith("test_accuracy="):
            return float(tok.split("=", 1)[1])
    log("evaluation failed: %s" % (r.stderr.strip().splitlines() or ["?"])[-1])
    return float("nan")


def fault(rnd, args, servers, workers, pending, events, kills, ctl_env, now, last_server_kill):
    """One fault at random (kill -9 of a server of args.kill_servers, also
    while it writes a checkpoint; SIGSTOP of a server; kill -9 or SIGSTOP
    of a worker), its second half queued in pending; returns the time of
    the last server kill."""
    roll = rnd.random()
    busy = any(p[1][0] == "start" or (p[1][0] == "cont" and isinstance(p[1][1], Server))
               for p in pending)
    if roll < 0.25 and not busy and now - last_server_kill > args.server_kill_gap:
        s = servers[rnd.choice(args.kill_servers)]
        in_ckpt = rnd.random() < 0.3
        if in_ckpt:
            subprocess.Popen([os.path.join(BIN, "gddr-ctl"), "-s", s.endpoint, "-t", "1000", "checkpoint"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ctl_env)
            time.sleep(rnd.uniform(0.0, 0.15))
            events["server_kill_in_checkpoint"] += 1
        s.signal(signal.SIGKILL)
        s.proc.wait()
        s.reap()
        kills.append([time.monotonic(), time.time(), None])
        events["server_kill"] += 1
        pending.append((time.monotonic() + rnd.uniform(0.5, 3.0), ("start", s, len(kills) - 1)))
        log("kill -9 gddr-ps %d%s" % (s.i, " while it writes a checkpoint" if in_ckpt else ""))
        return now
    if roll < 0.4 and not busy:
        s = rnd.choice(servers)
        s.signal(signal.SIGSTOP)
        pending.append((now + rnd.uniform(1, 8), ("cont", s)))
        events["server_stop"] += 1
    elif roll < 0.75:
        w = rnd.choice(workers)
        if w.proc:
            w.signal(signal.SIGKILL)
            events["worker_kill"] += 1
    else:
        w = rnd.choice(workers)
        if w.proc:
            w.signal(signal.SIGSTOP)
            pending.append((now + rnd.uniform(0.5, 5), ("cont", w)))
            events["worker_stop"] += 1
    return last_server_kill


def tend(servers, workers, pending, kills, now):
    """One turn of a soak's loop: a server that exited unplanned is started
    again (the run goes on), a worker that finished runs again, and the
    faults' second halves that are due are done."""
    for s in servers:
        if s.reap() and not any(a[1][0] == "start" and a[1][1] is s for a in pending):
            s.start()
    for w in workers:
        w.check(restart=True)
    for item in [p for p in pending if p[0] <= now]:
        pending.remove(item)
        do_action(item[1], kills)


def ctl_env_of(keys, tmp):
    """The environment gddr-ctl needs for the pair's CURVE."""
    return dict(os.environ, GDDR_CURVE_SERVER_KEY=keys["server_pub"],
                GDDR_CURVE_KEY_FILE=os.path.join(tmp, "client.key"))


def run(args, chaos):
    tmp = tempfile.mkdtemp(prefix="gddr-soak.")
    keys = keygen(tmp)
    ctl_env = ctl_env_of(keys, tmp)
    with open(os.path.join(tmp, "authorized_keys"), "w") as f:
        f.write(keys["client_pub"] + "\n")
    world = args.workers + 1
    sets = ["mode=async", "workers=%d" % world, "lr=0.05", "log_level=info",
            "checkpoint_interval_s=%g" % args.ckpt_interval,
            "curve_secret_key_file=" + os.path.join(tmp, "server.key"),
            "authorized_keys=" + os.path.join(tmp, "authorized_keys"),
            "worker_timeout_s=10"]
    if args.push_log != "off":
        sets.append("push_log=" + args.push_log)
    servers = [Server(i, tmp, sets) for i in range(2)]
    for s in servers:
        s.start()
    eps = ",".join(s.endpoint for s in servers)
    data = data_args()
    curve = ["--opt", "curve_server_key=" + keys["server_pub"],
             "--opt", "curve_key_file=" + os.path.join(tmp, "client.key")]
    workers = []
    for r in range(args.workers):
        argv = [os.path.join(BIN, "gddr-train"), "--server", eps, "--rank", str(r),
                "--world", str(world), "--workload", "mlp", "--steps", str(args.steps),
                "--seed", str(r + 1), "--delay-fraction", "0.4", "--pull-delta-bits", "8",
                "--progress", "0", "--verbose"] + data + curve
        workers.append(Worker(r, argv, tmp))
    for w in workers:
        w.start()
    stop_file = os.path.join(tmp, "stop")
    steps_file = os.path.join(tmp, "conserve.steps")
    result_file = os.path.join(tmp, "conserve.json")
    cons_err = open(os.path.join(tmp, "conserve.err"), "ab")
    cons = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--conserve",
                             "--servers", eps, "--rank", str(args.workers), "--world", str(world),
                             "--server-key=" + keys["server_pub"],
                             "--key-file", os.path.join(tmp, "client.key"),
                             "--stop-file", stop_file, "--steps-file", steps_file,
                             "--result-file", result_file],
                            stdout=cons_err, stderr=cons_err)
    log("%s: 2 servers (%s), %d workers, 1 conservation worker, %s s, push_log %s, "
        "checkpoints every %g s; files in %s" % ("soak" if chaos else "baseline", eps, args.workers,
                                                 args.seconds, args.push_log, args.ckpt_interval, tmp))
    rnd = random.Random(args.seed)
    stop = threading.Event()
    counts = {"sent": 0, "dropped": 0}
    mal = None
    if chaos:
        mal = threading.Thread(target=malformed, args=([s.endpoint for s in servers], keys, stop, counts),
                               daemon=True)
        mal.start()
    events = {"server_kill": 0, "server_kill_in_checkpoint": 0, "server_stop": 0,
              "worker_kill": 0, "worker_stop": 0}
    kills = []           # (monotonic time of the kill, wall time of the kill, wall time of the restart)
    pending = []         # (due, action)
    end = time.monotonic() + args.seconds
    next_event = time.monotonic() + rnd.uniform(3, 6)
    last_server_kill = 0.0
    while time.monotonic() < end:
        now = time.monotonic()
        tend(servers, workers, pending, kills, now)
        if cons.poll() is not None:
            raise RuntimeError("the conservation worker died: %s" % last_line(cons_err.name))
        if chaos and now >= next_event:
            next_event = now + rnd.uniform(args.gap * 0.5, args.gap * 1.5)
            last_server_kill = fault(rnd, args, servers, workers, pending, events, kills, ctl_env, now,
                                     last_server_kill)
        for s in servers:
            s.sample()
        time.sleep(0.2)
    # Calm down: everything resumed, every server up.
    stop.set()
    for due, act in sorted(pending, key=lambda p: p[0]):
        do_action(act, kills)
    for s in servers:
        if s.reap():
            s.start()
    log("faults stop; the workers finish their runs")
    deadline = time.monotonic() + args.drain_s
    for w in workers:
        while w.proc and w.proc.poll() is None and time.monotonic() < deadline:
            for s in servers:
                s.sample()
            time.sleep(0.5)
        if w.proc and w.proc.poll() is None:
            stop_proc(w, 60)
        w.check(restart=False)
    open(stop_file, "w").close()
    try:
        cons.wait(180)
    except subprocess.TimeoutExpired:
        cons.kill()
    acc = evaluate(eps, keys, tmp, data)
    dup = 0
    for s in servers:
        r = subprocess.run([os.path.join(BIN, "gddr-ctl"), "-s", s.endpoint, "metrics"],
                           capture_output=True, text=True,
                           env=ctl_env)
        for line in r.stdout.splitlines():
            if line.startswith("gddr_duplicate_pushes_total "):
                dup += int(float(line.split()[1]))
    for s in servers:
        stop_proc(s, 30)
        s.planned = True
        s.reap()
    return account(args, tmp, servers, workers, kills, events, counts, acc, dup, result_file,
                   steps_file, cons)


def account(args, tmp, servers, workers, kills, events, counts, acc, dup, result_file, steps_file, cons):
    try:
        cr = json.load(open(result_file))
    except (OSError, ValueError):
        cr = None
    rep = {"seconds": args.seconds, "push_log": args.push_log, "events": events,
           "malformed_sent": counts["sent"], "duplicates_refused": dup, "accuracy": acc,
           "tmp": tmp}
    unplanned = [u for s in servers for u in s.unplanned] + [u for w in workers for u in w.unplanned]
    if cons.returncode not in (0, None):
        unplanned.append("conservation worker exited with %s" % cons.returncode)
    rep["unplanned_exits"] = unplanned
    if cr:
        acked, lost, final = sum(cr["acked"]), sum(cr["lost"]), sum(cr["final_version"])
        rep.update(acked=acked, applied=final, lost=lost, unaccounted=acked - final - lost,
                   torn=cr["torn"], conserve_errors=cr["n_errors"])
    else:
        rep.update(acked=None, unaccounted=None, torn=["no account from the conservation worker"])
    # recovery: from each kill to the next step the conservation worker completed
    oks = []
    for line in open(steps_file) if os.path.exists(steps_file) else []:
        parts = line.split()
        if len(parts) >= 2 and parts[1] == "ok":
            oks.append(float(parts[0]))
    rec_kill, rec_restart = [], []
    for _, t_kill, t_restart in kills:
        after = [t for t in oks if t > (t_restart or t_kill)]
        if after:
            rec_kill.append(after[0] - t_kill)
            if t_restart:
                rec_restart.append(after[0] - t_restart)
    rep["recovery_from_kill_s"] = {"median": statistics.median(rec_kill) if rec_kill else None,
                                   "p95": percentile(rec_kill, 0.95) if rec_kill else None,
                                   "n": len(rec_kill)}
    rep["recovery_from_restart_s"] = {"median": statistics.median(rec_restart) if rec_restart else None,
                                      "p95": percentile(rec_restart, 0.95) if rec_restart else None}
    # the replay's share: each restart's "push log: replayed N records ... in T ms"
    replay_ms = []
    for s in servers:
        for line in open(s.logf.name, errors="replace"):
            if "push log: replayed" in line and " ms" in line:
                try:
                    replay_ms.append(float(line.rsplit(" in ", 1)[1].split()[0]))
                except (IndexError, ValueError):
                    pass
    rep["replay_ms"] = {"median": statistics.median(replay_ms) if replay_ms else None,
                        "max": max(replay_ms) if replay_ms else None, "n": len(replay_ms)}
    growth = []
    for s in servers:
        for start, end_, samples in s.lives:
            if end_ is None or end_ - start < 60:
                continue
            half = start + (end_ - start) / 2
            sec = [x for x in samples if x[0] >= half]
            if len(sec) >= 2 and sec[0][1] > 0:
                growth.append({"server": s.i, "life_s": round(end_ - start),
                               "rss_kb": [sec[0][1], sec[-1][1]],
                               "rss_growth": (sec[-1][1] - sec[0][1]) / sec[0][1],
                               "fds": [sec[0][2], sec[-1][2]]})
    rep["server_lives"] = growth
    # The bound is for a server that lived through most of the run (one
    # that is never killed: --kill-servers); short lives end in a kill
    # before a leak could show, and their start is the allocator's warm-up.
    worst = max((g["rss_growth"] for g in growth if g["life_s"] >= args.seconds / 2), default=0.0)
    rep["worst_rss_growth"] = worst
    ok = (rep["unaccounted"] == 0 and not rep["torn"] and not unplanned and
          (args.max_rss_growth is None or worst <= args.max_rss_growth) and
          (args.push_log != "always" or rep.get("lost") == 0))
    rep["ok"] = ok
    print("\n## soak: %d s, push_log %s\n" % (args.seconds, args.push_log))
    print("| | |\n|---|---|")
    for k in ("acked", "applied", "lost", "unaccounted", "duplicates_refused", "conserve_errors",
              "malformed_sent", "accuracy", "worst_rss_growth"):
        print("| %s | %s |" % (k.replace("_", " "), rep.get(k)))
    print("| faults | %s |" % ", ".join("%s %d" % kv for kv in events.items()))
    rk = rep["recovery_from_kill_s"]
    print("| recovery from a server kill (s) | median %s, p95 %s over %d kills |" % (
        fmt(rk["median"]), fmt(rk["p95"]), rk["n"]))
    rr = rep["recovery_from_restart_s"]
    print("| ... from its restart (s) | median %s, p95 %s |" % (fmt(rr["median"]), fmt(rr["p95"])))
    rp = rep["replay_ms"]
    print("| push log replay at a restart (ms) | median %s, max %s over %d restarts |" % (
        fmt(rp["median"]), fmt(rp["max"]), rp["n"]))
    print("| torn tensors | %s |" % (rep["torn"] or "none"))
    print("| unplanned exits | %s |" % (len(unplanned)))
    for u in unplanned:
        print("  - " + u)
    for g in growth:
        print("  server %d, a life of %d s: RSS %d -> %d kB (%+.2f%%), open files %d -> %d" % (
            g["server"], g["life_s"], g["rss_kb"][0], g["rss_kb"][1], 100 * g["rss_growth"],
            g["fds"][0], g["fds"][1]))
    print("\nsoak: %s (files in %s)" % ("OK" if ok else "FAILED", tmp))
    if args.json:
        json.dump(rep, open(args.json, "w"), indent=1)
    return rep


def fmt(x):
    return "-" if x is None else "%.2f" % x


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_S", 3600)))
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--steps", type=int, default=3000, help="steps of one worker run")
    p.add_argument("--ckpt-interval", type=float, default=5.0)
    p.add_argument("--push-log", default="off", choices=["off", "batch", "always"])
    p.add_argument("--gap", type=float, default=4.0, help="mean seconds between faults")
    p.add_argument("--server-kill-gap", type=float, default=15.0,
                   help="at least this many seconds between two server kills")
    p.add_argument("--drain-s", type=float, default=120.0,
                   help="at the end, how long the workers may take to finish their runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kill-servers", default="0",
                   help="the servers that may be killed (comma-separated indexes; the others are "
                        "only stopped, so one lives the whole run and shows a leak)")
    p.add_argument("--baseline", action="store_true", help="first an undisturbed run as long")
    p.add_argument("--max-rss-growth", type=float, default=None)
    p.add_argument("--json", default=None)
    # the conservation worker
    p.add_argument("--conserve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--servers", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--server-key", help=argparse.SUPPRESS)
    p.add_argument("--key-file", help=argparse.SUPPRESS)
    p.add_argument("--stop-file", help=argparse.SUPPRESS)
    p.add_argument("--steps-file", help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    p.add_argument("--tensors", type=int, default=6, help=argparse.SUPPRESS)
    p.add_argument("--reconnect-ms", type=int, default=600000, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.kill_servers = [int(x) for x in str(args.kill_servers).split(",") if x != ""]
    if args.conserve:
        return conserve(args)
    base = None
    if args.baseline:
        base = run(args, chaos=False)
    rep = run(args, chaos=True)
    if base is not None:
        print("\nserver model accuracy: %.4f under faults, %.4f undisturbed (%+.4f)" % (
            rep["accuracy"], base["accuracy"], rep["accuracy"] - base["accuracy"]))
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
