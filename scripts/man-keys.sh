#!/usr/bin/env bash
# man-keys.sh TEMPLATE < TABLE: TEMPLATE (man/gddr-ps.ini.5.scd) with its
# line @KEYS@ replaced by every key of TABLE, the Markdown reference table
# that `gddr-ps --dump-config --markdown` prints from the server's and the
# client's key tables (server/config.c, client/src/options.c), in scdoc:
#
#   ## [section]
#
#   *key* = _default_
#   <tab>meaning
#
# The Makefile runs it to make build/man/gddr-ps.ini.5, so the page lists
# exactly the keys the programs know. scdoc's markup characters (* _ \) in
# the table's text are escaped; Markdown's backquotes are dropped.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: man-keys.sh TEMPLATE < TABLE" >&2; exit 2; }
grep -qx '@KEYS@' "$1" || { echo "man-keys.sh: $1 has no @KEYS@ line" >&2; exit 1; }
keys=$(awk -F'|' '
  function esc(s) { gsub(/`/, "", s); gsub(/\\/, "\\\\", s); gsub(/\*/, "\\*", s); gsub(/_/, "\\_", s)
                    sub(/^ +/, "", s); sub(/ +$/, "", s); return s }
  NF < 5 || $2 ~ /^ *key *$/ || $2 ~ /^-+$/ { next }
  $2 ~ /\*\*\[/ { s = $2; gsub(/[ *]/, "", s); printf "## %s\n\n", s; next }
  {
    k = esc($2); d = esc($3); m = esc($4)
    if (k == "") next
    n++
    printf "*%s* = %s\n\t%s\n\n", k, (d == "\"\"" ? "(empty)" : "_" d "_"), m
  }
  END { if (n < 1) exit 1 }')
[ -n "$keys" ] || { echo "man-keys.sh: no key in the table" >&2; exit 1; }
while IFS= read -r line; do
  if [ "$line" = '@KEYS@' ]; then printf '%s\n' "$keys"; else printf '%s\n' "$line"; fi
done < "$1"
