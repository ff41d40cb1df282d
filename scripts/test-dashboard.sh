#!/usr/bin/env bash
# config/grafana-gddr-ps.json: valid JSON, every panel has a query, and every
# gddr_* metric a query names is one gddr-ps exports (asked of a running
# server); the views the operator needs are there (throughput, staleness
# histogram, tau, workers, checkpoints, auth rejections).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
me=test-dashboard
BIN=${GDDR_BIN:-build/bin}
tmp=$(mktemp -d /tmp/gddr-dash.XXXXXX)
cleanup() { stop_pidfile "$tmp/ps.pid"; rm -rf "$tmp"; }
trap cleanup EXIT
ep=$("$BIN/gddr-ps" --listen 'tcp://127.0.0.1:*' --detach --pid-file "$tmp/ps.pid" 2> "$tmp/ps.log") ||
  { cat "$tmp/ps.log" >&2; echo "$me: FAIL: gddr-ps did not start" >&2; exit 1; }
"$BIN/gddr-ctl" -s "$ep" metrics > "$tmp/metrics"
/usr/bin/python3 - config/grafana-gddr-ps.json "$tmp/metrics" <<'PY'
import json, re, sys
dash = json.load(open(sys.argv[1]))
families = {l.split()[2] for l in open(sys.argv[2]) if l.startswith("# TYPE ")}
used, bad = set(), []
for p in dash["panels"]:
    exprs = [t["expr"] for t in p.get("targets", [])]
    if not exprs:
        bad.append("panel '%s' has no query" % p["title"])
    for e in exprs:
        for m in re.findall(r"\bgddr_[a-z0-9_]+", e):
            fam = re.sub(r"_(bucket|sum|count)$", "", m) if m not in families else m
            used.add(fam)
            if fam not in families:
                bad.append("panel '%s' queries %s, which gddr-ps does not export" % (p["title"], m))
need = {"gddr_pushes_total", "gddr_staleness", "gddr_tau", "gddr_live_workers",
        "gddr_checkpoints_total", "gddr_auth_rejected_total"}
bad += ["no panel shows %s" % m for m in sorted(need - used)]
if bad:
    sys.exit("test-dashboard: FAIL: " + "; ".join(bad))
print("test-dashboard: OK (%d panels, %d metric families, all exported by gddr-ps)" % (len(dash["panels"]), len(used)))
PY
