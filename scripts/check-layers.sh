#!/usr/bin/env bash
# The layering rules, checked on the build (make check runs it):
#
#   daemon   gddr-ps holds no client code: no global symbol that an object
#            of client/src defines is defined in it (gddr_client_open,
#            gddr_step_submit, the shard and heartbeat code, ...).
#
# Usage: scripts/check-layers.sh [BUILD]   (BUILD: the build folder, default
# the parent of $GDDR_BIN, else build)
set -euo pipefail
cd "$(dirname "$0")/.."
me=check-layers
build=${1:-$(dirname "${GDDR_BIN:-build/bin}")}
status=0
fail() { echo "$me: FAIL: $*" >&2; status=1; }

# ---- daemon: no client code in gddr-ps ------------------------------------
ps=$build/bin/gddr-ps
objs=("$build"/cpu/obj/client/src/*.o)
[ -x "$ps" ] && [ -e "${objs[0]}" ] || { echo "$me: $ps or the client's objects are missing (run make)" >&2; exit 1; }
# Global definitions (text, data, bss, read-only) of the client's objects.
client_syms=$(nm --defined-only "${objs[@]}" | awk 'NF == 3 && $2 ~ /^[TDBR]$/ { print $3 }' | sort -u)
ps_syms=$(nm --defined-only "$ps" | awk 'NF == 3 { print $3 }' | sort -u)
leaked=$(comm -12 <(echo "$client_syms") <(echo "$ps_syms"))
# The names the issue found there, also when their object were renamed.
named=$(echo "$ps_syms" | grep -E '^(gddr_client_open|gddr_step_submit|gddr__shards_[a-z_]+|gddr__heartbeat_(start|stop))$' || true)
if [ -n "$leaked$named" ]; then
  fail "gddr-ps links client code:"
  printf '%s\n%s\n' "$leaked" "$named" | sort -u | sed '/^$/d; s/^/  /' >&2
fi
[ "$(echo "$client_syms" | grep -c '^gddr_client_open$')" = 1 ] ||
  fail "gddr_client_open is not among the client's symbols: the check would prove nothing"

[ "$status" -eq 0 ] && echo "$me: OK (gddr-ps holds none of the client's $(echo "$client_syms" | wc -l) global symbols)"
exit "$status"
