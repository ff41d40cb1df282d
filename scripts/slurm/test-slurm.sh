#!/usr/bin/env bash
# test-slurm.sh -- run scripts/slurm/gddr.sbatch on a real, throw-away,
# one-node Slurm cluster: munged, slurmctld and slurmd on this host (as
# root), with a key, a slurm.conf and every state file in a temporary
# folder. Submits the job with `sbatch --wait` (bounded), checks it, and
# stops and removes everything it started, also when it fails.
#
#   scripts/slurm/test-slurm.sh [SERVERS [WORKERS]]     (make slurm-check)
#
# SERVERS defaults to 1.
# It needs root and Debian's slurm-wlm and munge (installed here through
# scripts/install-deps.sh --slurm when missing); where those cannot be
# had it prints "SKIP: why" and exits 0.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
me=test-slurm
servers=${1:-1} workers=${2:-2}
BIN=${GDDR_BIN:-build/bin}
job_timeout=${GDDR_SLURM_TIMEOUT:-300}

skip() { echo "SKIP: $me: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root to run slurmctld and slurmd"
for p in gddr-ps gddr-train gddr-ctl; do
  [ -x "$BIN/$p" ] || { echo "$me: $BIN/$p missing: build first (make)" >&2; exit 1; }
done
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  scripts/install-deps.sh --slurm >&2 || skip "could not install slurm-wlm and munge"
fi
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "$me: Fashion-MNIST is missing: run scripts/install-deps.sh" >&2; exit 1; }

tmp=$(mktemp -d /tmp/gddr-slurm.XXXXXX)
chmod 755 "$tmp"
pids=() jobid=
cleanup() {
  local rc=$? p
  [ -z "$jobid" ] || SLURM_CONF=$tmp/slurm.conf scancel "$jobid" 2>/dev/null || true
  for ((p = ${#pids[@]} - 1; p >= 0; p--)); do stop_pid "${pids[$p]}"; done
  if [ "$rc" != 0 ]; then
    for f in slurmctld.log slurmd.log munged.log; do
      [ -s "$tmp/$f" ] && { echo "--- $f (last lines)"; tail -n 15 "$tmp/$f"; } >&2
    done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# munge, on a socket and with a key of its own (the system's are untouched).
dd if=/dev/urandom of="$tmp/munge.key" bs=1 count=1024 status=none
chmod 400 "$tmp/munge.key"
munged -F --force --key-file="$tmp/munge.key" --socket="$tmp/munge.socket" \
  --pid-file="$tmp/munged.pid" --log-file="$tmp/munged.log" --seed-file="$tmp/munged.seed" \
  2> "$tmp/munged.err" &
pids+=($!)
for _ in $(seq 50); do [ -S "$tmp/munge.socket" ] && break; sleep 0.1; done
[ -S "$tmp/munge.socket" ] || skip "munged did not start: $(tail -n 3 "$tmp/munged.log" 2>/dev/null)"

# Two free loopback ports for slurmctld and slurmd.
read -r ctl_port node_port < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
node=$(hostname -s)
cpus=$(nproc)
mkdir -p "$tmp/state" "$tmp/spool" "$tmp/job"
cat > "$tmp/slurm.conf" <<EOF
ClusterName=gddrtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$node_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge.socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=60
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=gddr Nodes=$node Default=YES MaxTime=30 State=UP
EOF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" > "$tmp/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" > "$tmp/slurmd.out" 2>&1 &
pids+=($!)
state=
for _ in $(seq 300); do
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.1
done
[ "$state" = idle ] || skip "the one-node cluster did not come up (node state '${state:-none}'): $(tail -n 3 "$tmp/slurmctld.log" "$tmp/slurmd.log" 2>/dev/null | tr '\n' ' ')"
echo "== Slurm $(sinfo -V | cut -d' ' -f2) up: node $node idle ($cpus CPUs); submitting gddr.sbatch: $servers server(s), $workers workers"

out=$tmp/job/gddr.out
set +e
sub=$(timeout "$job_timeout" sbatch --wait --parsable -N 1 -n "$workers" -D "$tmp/job" -o "$out" \
  --export="ALL,GDDR_HOME=$repo,GDDR_BIN=$(cd "$BIN" && pwd),GDDR_BIND_HOST=127.0.0.1" \
  scripts/slurm/gddr.sbatch --servers "$servers" --set checkpoint_interval_s=1 \
  -- --workload softmax --epochs 1 --seed 7)
rc=$?
set -e
jobid=${sub%%;*}
echo "== job ${jobid:-?}: sbatch --wait exited $rc; its output:"
sed 's/^/  | /' "$out" 2>/dev/null || true
[ "$rc" != 124 ] || { echo "$me: FAILED: the job did not finish within $job_timeout s" >&2; exit 1; }
job_state=$(scontrol show job "$jobid" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
fail=0
check() { # DESCRIPTION COMMAND...
  local what=$1
  shift
  if "$@"; then echo "  ok: $what"; else echo "  FAILED: $what" >&2; fail=1; fi
}
echo "== checks"
check "sbatch --wait exited 0" [ "$rc" = 0 ]
check "job state COMPLETED (is ${job_state:-unknown})" [ "$job_state" = COMPLETED ]
n_results=$(grep -c '^RESULT rank=' "$out" 2>/dev/null || true)
check "every worker finished its run ($n_results of $workers RESULT lines)" [ "$n_results" = "$workers" ]
final=$(grep '^RESULT server_model=1' "$out" 2>/dev/null | tail -n 1 || true)
acc=$(field test_accuracy "$final")
check "the servers' final model was evaluated (test accuracy ${acc:-none}, at least 0.70)" \
  awk -v a="$acc" 'BEGIN { exit !(a + 0 >= 0.70) }'
n_stopped=$(grep -c 'gddr.sbatch: gddr-ps [0-9]* on .* stopped' "$out" 2>/dev/null || true)
check "all $servers server(s) stopped cleanly by the job" [ "$n_stopped" = "$servers" ]
n_ckpt=$(find "$tmp/job/gddr-$jobid" -name 'ckpt-*.gddr' 2>/dev/null | wc -l || true)
check "the servers wrote checkpoints ($n_ckpt files)" [ "$n_ckpt" -ge "$servers" ]
[ "$fail" = 0 ] || { echo "$me: FAILED" >&2; exit 1; }
echo "$me: PASSED: gddr.sbatch ran on slurmctld/slurmd with $servers server(s) and $workers workers"
