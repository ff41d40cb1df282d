#!/usr/bin/env bash
# GDDR on a constrained network, measured the way a cluster user feels it.
# Two network namespaces joined by a veth pair, rate-limited each way with
# `tc tbf` (netem is missing from some kernels); gddr-ps in one, W gddr-train
# workers in the other; an observer in the server's namespace (so it does not
# use the limited link) pulls the server's model every few seconds and
# evaluates it on the test set, with timestamps. Needs root and `ip netns`:
# without them it says so and exits 0 with nothing measured.
#
#   scripts/experiment-network.sh                     every row, sync and async, 100 Mbit/s
#   scripts/experiment-network.sh --rates "100mbit 1gbit" --modes async --rows "dense gddr-both"
#   scripts/experiment-network.sh --quick             a small model, 30 steps (minutes)
#   scripts/experiment-network.sh --smoke             the make-check test: one short
#                                                     rate-limited run, asserted
#   scripts/experiment-network.sh --plot DIR...       PNGs under docs/ from result folders
#                                                      (a row is drawn once per rate and mode:
#                                                      from the first DIR that has it)
#
# (--table FILE... prints the Markdown table of result files.)
# Options: --rates "R..." (tc rates: 100mbit, 1gbit), --modes "sync async",
# --rows "...", --workers W (4), --steps S (200), --hidden H (1280), --batch B
# (128), --eval-every SEC (3), --sync-momentum M (0.9; another value labels
# the mode sync-mM in the results), --tag T (appended to the mode's label,
# e.g. async-500steps, so a longer series plots apart), --out DIR (kept:
# results.txt, curve-*.dat, worker-*.log (each worker's output), table.md; default a new /tmp/gddr-net.XXXXXX).
#
# The model: the MLP 784-1280-10 (1,017,610 parameters, 4.07 MB a copy in
# float32): about a million parameters, so that a step moves megabytes and the
# link, not the two-core CPU, is what a dense step waits on at 100 Mbit/s
# (a push and a pull of 4 workers is ~33 MB, ~2.6 s of link a step; the
# gradient is ~30 ms of CPU). Fashion-MNIST, batch 128 a worker.
#
# Rows (trainer flags; the mode is the server's `mode`):
#   dense        -
#   adadelay     server adadelay=0.5 (async only: sync has no staleness)
#   gddr-push    --delay-fraction 0.4
#   gddr-both    --delay-fraction 0.4 --pull-delay-fraction 0.4
#   gddr-pipe    --delay-fraction 0.4 --pull-delay-fraction 0.4 --pipeline
#   acc2, acc4   --accumulate-steps 2 / 4 (same examples, 1/k of the pushes)
#   q8           --pull-delta-bits 8 (pulls as 8-bit differences from the view)
#   gddr-q8      --delay-fraction 0.4 --pull-delta-bits 8 (GDDR pushes, 8-bit pulls)
#   gddr0.1-q8   --delay-fraction 0.1 --pull-delta-bits 8 (fewer chunks held: sync with momentum)
#   q8auto       --pull-delta-bits 8 --opt pull_delta_auto=true (8-bit pulls only while they
#                are the cheaper: the worker times them against whole pulls)
#   gddr-q8-auto gddr-q8 with pull_delta_auto and delay_auto (holds only while they make
#                the pushes cheaper): the setting for a link the worker does not know
# Server: lr 0.1; in sync also momentum 0.9 (one update of the mean of W
# gradients a step: without momentum 200 steps stay near 0.80); in async no
# momentum (with it 4 workers' stale updates diverge: 0.39 at lr 0.05).
#
# Columns: step time (mean and p95 of the wall time of one loop iteration,
# gradient plus gddr_step, per worker: gddr-train --step-times; p95 is the
# mean over workers of each one's p95), bytes per worker step each way
# counted on the workers' end of the veth (every byte that crossed the link:
# TCP/IP headers and ZeroMQ framing included), time from the workers' start
# until the server's model first scores >= 0.85 on the test set, and the
# server's final test accuracy (after every worker flushed and left); also
# the time to 0.80, for rows where 0.85 is not reached in the steps run.
# Machine-readable: one NETROW line per row (also in OUT/results.txt);
# accuracy against time in OUT/curve-RATE-MODE-ROW.dat.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
BIN=${GDDR_BIN:-build/bin}
BIN=$(cd "$BIN" 2>/dev/null && pwd || echo "$BIN")
rates="100mbit" modes="sync async" rows="dense adadelay gddr-push gddr-both gddr-pipe acc2 acc4"
workers=4 steps=200 hidden=1280 batch=128 eval_every=3 out= quick=0 smoke=0 plot=0 sync_momentum=0.9 tag=
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) rates=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --hidden) hidden=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --sync-momentum) sync_momentum=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --smoke) smoke=1; shift ;;
    --plot) plot=1; shift; break ;;
    --table) break ;;
    -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
    *) echo "experiment-network: unknown option $1" >&2; exit 2 ;;
  esac
done

# table FILE...: the Markdown table of NETROW lines; ratios against the dense
# row of the same rate and mode.
table() {
  echo "| rate | mode | row | step ms mean | p95 | vs dense | up B/step | down B/step | up vs dense | down vs dense | t to 0.80 (s) | vs dense | t to 0.85 (s) | vs dense | final acc | dacc (pp) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  awk '{ delete v; for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
         k = v["rate"] " " v["mode"]; n++; key[n] = k; row[n] = v["row"]
         sm[n] = v["step_mean_ms"]; sp[n] = v["step_p95_ms"]; up[n] = v["up_bytes_per_step"]
         dn[n] = v["down_bytes_per_step"]; t[n] = v["t85_s"]; e[n] = v["t80_s"]; f[n] = v["final_acc"]
         if (v["row"] == "dense") { dsm[k] = sm[n]; dup[k] = up[n]; ddn[k] = dn[n]; dt[k] = t[n]; de[k] = e[n]; df[k] = f[n] } }
       function r(a, b) { return (b != "" && b + 0 > 0 && a != "-") ? sprintf("%.2fx", a / b) : "-" }
       END { for (i = 1; i <= n; i++) { k = key[i]; split(k, rm, " ")
         da = (k in df && df[k] != "?" && f[i] != "?") ? sprintf("%+.2f", 100 * (f[i] - df[k])) : "-"
         printf "| %s | %s | %s | %.0f | %.0f | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |\n", rm[1], rm[2], row[i],
           sm[i], sp[i], r(sm[i], dsm[k]), up[i], dn[i], r(up[i], dup[k]), r(dn[i], ddn[k]),
           e[i], (de[k] == "-" || de[k] == "" ? "-" : r(e[i], de[k])),
           t[i], (dt[k] == "-" ? "-" : r(t[i], dt[k])), f[i], da } }' "$@"
}
if [ "${1:-}" = --table ]; then shift; table "$@"; exit 0; fi

# ---- pictures: gnuplot from result folders --------------------------------
if [ "$plot" = 1 ]; then
  command -v gnuplot >/dev/null || { echo "experiment-network: gnuplot is missing (scripts/install-deps.sh)" >&2; exit 1; }
  [ $# -gt 0 ] || { echo "experiment-network: --plot DIR..." >&2; exit 2; }
  res=$(mktemp /tmp/gddr-net-plot.XXXXXX)
  trap 'rm -f "$res"' EXIT
  cat "${@/%//results.txt}" > "$res"
  for rm in $(sed -n 's/.*rate=\([^ ]*\) mode=\([^ ]*\) .*/\1:\2/p' "$res" | sort -u); do
    rate=${rm%%:*} mode=${rm#*:}
    cmd="plot 0.85 w l dt 2 lc rgb 'gray' t '0.85'"
    for row in $(sed -n "s/.*rate=$rate mode=$mode row=\([^ ]*\) .*/\1/p" "$res" | awk '!seen[$0]++'); do
      for d in "$@"; do
        f="$d/curve-$rate-$mode-$row.dat"
        [ -s "$f" ] && { cmd+=", '$f' u 1:2 w lp pt 7 ps 0.4 t '$row'"; break; }
      done
    done
    gnuplot <<EOF
set terminal pngcairo size 900,560 noenhanced
set output 'docs/network-accuracy-$rate-$mode.png'
set title "Server's test accuracy vs wall time: $rate, $mode, $(field workers "$(grep -m1 "rate=$rate mode=$mode" "$res")") workers"
set xlabel 'seconds since the workers started'; set ylabel 'test accuracy (server model)'
set yrange [0.1:0.9]; set key bottom right; set grid
$cmd
EOF
    echo "docs/network-accuracy-$rate-$mode.png"
  done
  # Step time per row: mean bar, p95 as an error bar's top.
  awk '{ r=""; for (i=1;i<=NF;i++) { split($i,kv,"="); v[kv[1]]=kv[2] }
         k = v["rate"] " " v["mode"] " " v["row"]; if (seen[k]++) next
         printf "\"%s\" %s %s\n", k, v["step_mean_ms"], v["step_p95_ms"] }' "$res" > "$res.st"
  gnuplot <<EOF
set terminal pngcairo size 1100,560 noenhanced
set output 'docs/network-step-time.png'
set title 'Step time per row (bar: mean, whisker: p95; per worker, one loop iteration)'
set ylabel 'ms'; set style fill solid 0.5; set boxwidth 0.7; set grid y
set xtics rotate by -45 font ',8'; set yrange [0:*]; set rmargin 10; set bmargin 8
plot '$res.st' u 0:2:xtic(1) w boxes t 'mean', '' u 0:2:2:3 w yerrorbars pt -1 lc rgb 'black' t 'p95'
EOF
  rm -f "$res.st"
  echo "docs/network-step-time.png"
  exit 0
fi

# ---- can we? ---------------------------------------------------------------
if [ "$(id -u)" -ne 0 ]; then
  echo "experiment-network: skipped: needs root (network namespaces and tc); nothing measured"
  exit 0
fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "experiment-network: skipped: ip or tc is missing (package iproute2); nothing measured"
  exit 0
fi
for p in gddr-ps gddr-train; do
  [ -x "$BIN/$p" ] || { echo "experiment-network: $BIN/$p is missing (run make)" >&2; exit 1; }
done

id=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
ns_s="gddr-s-$id" ns_w="gddr-w-$id" veth_s="gs$id" veth_w="gw$id"
tmp=$(mktemp -d /tmp/gddr-net.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do stop_pid "$p"; done
  ip netns del "$ns_s" 2>/dev/null || true
  ip netns del "$ns_w" 2>/dev/null || true
  ip link del "$veth_s" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# netns_up: the two namespaces and the veth pair between them, addresses
# 10.77.0.1 (server) and 10.77.0.2 (workers); names unique to this run.
netns_up() {
  if ! ip netns add "$ns_s" 2>"$tmp/err" || ! ip netns add "$ns_w" 2>>"$tmp/err"; then
    echo "experiment-network: skipped: ip netns does not work here ($(head -c 200 "$tmp/err")); nothing measured"
    exit 0
  fi
  ip link add "$veth_s" type veth peer name "$veth_w"
  ip link set "$veth_s" netns "$ns_s"
  ip link set "$veth_w" netns "$ns_w"
  ip -n "$ns_s" addr add 10.77.0.1/30 dev "$veth_s"
  ip -n "$ns_w" addr add 10.77.0.2/30 dev "$veth_w"
  local n
  for n in "$ns_s:$veth_s" "$ns_w:$veth_w"; do
    ip -n "${n%%:*}" link set lo up
    ip -n "${n%%:*}" link set "${n#*:}" up
  done
}

# shape RATE: tbf on each end's egress (so each direction is limited); the
# bucket holds 10 ms at the rate (at least 16 KB), the queue 50 ms.
rate_bits() {
  awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(substr(r, length(n "") + 1));
    m = (u ~ /^g/) ? 1e9 : (u ~ /^m/) ? 1e6 : (u ~ /^k/) ? 1e3 : 1; printf "%.0f\n", n * m }'
}
shape() {
  local bits burst
  bits=$(rate_bits "$1")
  burst=$(( bits / 800 > 16384 ? bits / 800 : 16384 ))
  tc -n "$ns_s" qdisc replace dev "$veth_s" root tbf rate "$1" burst "$burst" latency 50ms
  tc -n "$ns_w" qdisc replace dev "$veth_w" root tbf rate "$1" burst "$burst" latency 50ms
  echo "$burst"
}

# counters: "tx rx" bytes of the workers' end (tx: workers -> server)
counters() {
  ip netns exec "$ns_w" cat "/sys/class/net/$veth_w/statistics/tx_bytes" "/sys/class/net/$veth_w/statistics/rx_bytes" | tr '\n' ' '; echo
}

server_start() { # MODE SETS...
  local mode=$1
  shift
  local args=() s
  for s in "$@"; do args+=(--set "$s"); done
  rm -f "$tmp/endpoint"
  ip netns exec "$ns_s" "$BIN/gddr-ps" --listen 'tcp://10.77.0.1:*' --endpoint-file "$tmp/endpoint" \
    --set log_level=warn --set workers="$workers" --set mode="$mode" --set worker_timeout_s=60 \
    "${args[@]}" 2> "$tmp/server.log" &
  server_pid=$!
  pids+=("$server_pid")
  wait_file "$tmp/endpoint" 10 || { echo "experiment-network: gddr-ps did not start:" >&2; cat "$tmp/server.log" >&2; exit 1; }
  ep=$(cat "$tmp/endpoint")
}

data_args=()
if [ "$quick" = 1 ] || [ "$smoke" = 1 ]; then
  hidden=256 steps=30 eval_every=2
fi
if [ "$smoke" = 0 ]; then
  if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "experiment-network: Fashion-MNIST is missing (package dataset-fashion-mnist)" >&2
    exit 1
  fi
fi

# ---- the make-check smoke test -------------------------------------------------
if [ "$smoke" = 1 ]; then
  netns_up
  rate=20mbit
  burst=$(shape "$rate")
  bits=$(rate_bits "$rate")
  server_start async lr=0.1
  read -r tx0 rx0 < <(counters)
  t0=$(date +%s.%N)
  wp=()
  for ((r = 0; r < 2; r++)); do
    ip netns exec "$ns_w" "$BIN/gddr-train" --server "$ep" --rank "$r" --world 2 --workload mlp \
      --hidden "$hidden" --synthetic 2000 --steps 8 --quiet --step-times --timeout-ms 20000 > "$tmp/worker$r.log" 2>&1 &
    wp+=($!); pids+=($!)
  done
  wait_workers smoke "$tmp" 5 "${wp[@]}" >/dev/null || exit 1
  t1=$(date +%s.%N)
  read -r tx1 rx1 < <(counters)
  stop_server
  ap=0 al=0
  for ((r = 0; r < 2; r++)); do
    res=$(grep "^RESULT" "$tmp/worker$r.log")
    ap=$((ap + $(field bytes_pushed "$res"))) al=$((al + $(field bytes_pulled "$res")))
  done
  up=$((tx1 - tx0)) down=$((rx1 - rx0))
  echo "smoke: $rate, 2 workers, MLP hidden $hidden, 8 steps: link up $up B (workers pushed $ap B), down $down B (pulled $al B), $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s"
  fail=0
  # Every byte the workers sent crossed the link, with TCP/IP and ZeroMQ
  # framing on top (a few percent); more than 1.5x would mean something else
  # is counted.
  awk -v l="$up" -v a="$ap" 'BEGIN { exit !(l >= a && l <= 1.5 * a + 65536) }' ||
    { echo "smoke: FAIL: bytes up on the link ($up) not within [1, 1.5] x what the workers pushed ($ap)" >&2; fail=1; }
  awk -v l="$down" -v a="$al" 'BEGIN { exit !(l >= a && l <= 1.5 * a + 65536) }' ||
    { echo "smoke: FAIL: bytes down on the link ($down) not within [1, 1.5] x what the workers pulled ($al)" >&2; fail=1; }
  # Physics: through a tbf of rate R and bucket B, N bytes take at least
  # (N - B) * 8 / R seconds; a faster run means the limit is not there.
  awk -v n="$down" -v b="$burst" -v r="$bits" -v a="$t0" -v c="$t1" 'BEGIN { exit !(c - a >= (n - b) * 8 / r) }' ||
    { echo "smoke: FAIL: $down bytes down crossed faster than $rate allows" >&2; fail=1; }
  awk -v n="$up" -v b="$burst" -v r="$bits" -v a="$t0" -v c="$t1" 'BEGIN { exit !(c - a >= (n - b) * 8 / r) }' ||
    { echo "smoke: FAIL: $up bytes up crossed faster than $rate allows" >&2; fail=1; }
  [ "$fail" = 0 ] && echo "smoke: ok (namespaces, veth, tbf each way, counters, cleanup on exit)"
  exit "$fail"
fi

# ---- the experiment --------------------------------------------------------------
if [ -n "$out" ]; then mkdir -p "$out"; out=$(cd "$out" && pwd); else out=$(mktemp -d /tmp/gddr-net-out.XXXXXX); fi
netns_up
data_args=(--workload mlp --hidden "$hidden")
row_flags() {
  case "$1" in
    dense) ;;
    adadelay) ;;
    gddr-push) echo "--delay-fraction 0.4" ;;
    gddr-both) echo "--delay-fraction 0.4 --pull-delay-fraction 0.4" ;;
    gddr-pipe) echo "--delay-fraction 0.4 --pull-delay-fraction 0.4 --pipeline" ;;
    acc2) echo "--accumulate-steps 2" ;;
    acc4) echo "--accumulate-steps 4" ;;
    q8) echo "--pull-delta-bits 8" ;;
    gddr-q8) echo "--delay-fraction 0.4 --pull-delta-bits 8" ;;
    gddr0.1-q8) echo "--delay-fraction 0.1 --pull-delta-bits 8" ;;
    # (log_level=info: the workers' logs, kept in OUT, say when a kind changes)
    q8auto) echo "--pull-delta-bits 8 --opt pull_delta_auto=true --opt log_level=info" ;;
    gddr-q8-auto) echo "--delay-fraction 0.4 --pull-delta-bits 8 --opt pull_delta_auto=true --opt delay_auto=true --opt log_level=info" ;;
    *) echo "experiment-network: unknown row $1" >&2; exit 2 ;;
  esac
}

# one RATE MODE ROW: a run; appends a NETROW line to $out/results.txt
one() {
  local rate=$1 mode=$2 row=$3 sets=(lr=0.1) flags r label=$2
  if [ "$mode" = sync ]; then
    sets+=(momentum="$sync_momentum")
    [ "$sync_momentum" = 0.9 ] || label=sync-m$sync_momentum
  fi
  [ -z "$tag" ] || label+=-$tag
  [ "$row" = adadelay ] && sets+=(adadelay=0.5)
  read -r -a flags <<< "$(row_flags "$row")"
  shape "$rate" > /dev/null
  server_start "$mode" "${sets[@]}"
  local wp=() tx0 rx0 tx1 rx1 t0 t1 obs=
  read -r tx0 rx0 < <(counters)
  t0=$(date +%s.%N)
  for ((r = 0; r < workers; r++)); do
    ip netns exec "$ns_w" "$BIN/gddr-train" --server "$ep" --rank "$r" --world "$workers" "${data_args[@]}" \
      --batch "$batch" --steps "$steps" --quiet --step-times --timeout-ms 20000 ${flags[@]+"${flags[@]}"} > "$tmp/worker$r.log" 2>&1 &
    wp+=($!); pids+=($!)
  done
  # The observer, in the server's namespace (its pulls do not use the
  # limited link); it can start only once a worker registered the model.
  : > "$tmp/obs.log"
  for _ in $(seq 100); do
    ip netns exec "$ns_s" nice -n 5 "$BIN/gddr-train" --server "$ep" "${data_args[@]}" --evaluate \
      --evaluate-every "$eval_every" --quiet > "$tmp/obs.log" 2>&1 &
    obs=$!
    while kill -0 "$obs" 2>/dev/null && ! grep -q '^EVAL' "$tmp/obs.log"; do sleep 0.1; done
    grep -q '^EVAL' "$tmp/obs.log" && break
    wait "$obs" 2>/dev/null || true
    obs=
    sleep 0.3
  done
  [ -n "$obs" ] && pids+=("$obs")
  local fail=0
  wait_workers "$rate $mode $row" "$tmp" 0.5 "${wp[@]}" || fail=1
  t1=$(date +%s.%N)
  read -r tx1 rx1 < <(counters)
  stop_pid "$obs"
  local fin
  fin=$(field test_accuracy "$(ip netns exec "$ns_s" "$BIN/gddr-train" --server "$ep" "${data_args[@]}" --evaluate --quiet 2>&1 | grep '^RESULT' || true)")
  stop_server
  [ "$fail" = 0 ] || exit 1
  local curve="$out/curve-$rate-$label-$row.dat"
  awk -v t0="$t0" '/^EVAL/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "%.2f %s %s\n", v["time"] - t0, v["test_accuracy"], v["version"] }' "$tmp/obs.log" > "$curve"
  local sm=0 sp=0 ap=0 al=0 res
  for ((r = 0; r < workers; r++)); do
    cp "$tmp/worker$r.log" "$out/worker-$rate-$label-$row-$r.log"
    res=$(grep "^RESULT" "$tmp/worker$r.log")
    sm=$(awk -v a="$sm" -v b="$(field step_mean_ms "$res")" 'BEGIN{print a + b}')
    sp=$(awk -v a="$sp" -v b="$(field step_p95_ms "$res")" 'BEGIN{print a + b}')
    ap=$((ap + $(field bytes_pushed "$res"))) al=$((al + $(field bytes_pulled "$res")))
  done
  local t85 t80
  t85=$(awk '$2 >= 0.85 { print $1; found = 1; exit } END { if (!found) print "-" }' "$curve")
  t80=$(awk '$2 >= 0.80 { print $1; found = 1; exit } END { if (!found) print "-" }' "$curve")
  awk -v rate="$rate" -v mode="$label" -v row="$row" -v w="$workers" -v s="$steps" -v sm="$sm" -v sp="$sp" \
      -v up="$((tx1 - tx0))" -v dn="$((rx1 - rx0))" -v ap="$ap" -v al="$al" -v t85="$t85" -v t80="$t80" -v fin="${fin:-?}" \
      -v t0="$t0" -v t1="$t1" -v h="$hidden" -v b="$batch" '
    BEGIN { n = w * s
      printf "NETROW rate=%s mode=%s row=%s workers=%d steps=%d hidden=%d batch=%d step_mean_ms=%.1f step_p95_ms=%.1f up_bytes_per_step=%.0f down_bytes_per_step=%.0f app_up_per_step=%.0f app_down_per_step=%.0f t85_s=%s t80_s=%s final_acc=%s wall_s=%.1f\n",
        rate, mode, row, w, s, h, b, sm / w, sp / w, up / n, dn / n, ap / n, al / n, t85, t80, fin, t1 - t0 }' | tee -a "$out/results.txt"
}

echo "network experiment: $workers workers, MLP 784-$hidden-10, batch $batch, $steps steps each, rates: $rates, modes: $modes"
echo "results in $out"
for rate in $rates; do
  for mode in $modes; do
    for row in $rows; do
      [ "$row" = adadelay ] && [ "$mode" != async ] && continue
      one "$rate" "$mode" "$row"
    done
  done
done
table "$out/results.txt" > "$out/table.md"
echo
cat "$out/table.md"
