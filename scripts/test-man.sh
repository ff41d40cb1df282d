#!/usr/bin/env bash
# The manual pages (man/*.scd, built by make into build/man/ with scdoc):
# every program the packages install has one, and so has the INI format;
# each renders with `man -l` without a warning from man or groff, says its
# name, and names every option its program's --help lists; gddr-ps.ini(5)
# lists every key of `gddr-ps --dump-config --markdown` (server sections and
# [client]) with its default, and every key `gddr-ps --dump-config` prints.
set -euo pipefail
cd "$(dirname "$0")/.."
me=test-man
BIN=${GDDR_BIN:-build/bin}
MAN=$(dirname "$BIN")/man
fail() { echo "$me: FAIL: $*" >&2; exit 1; }
command -v man > /dev/null || fail "man not found (scripts/install-deps.sh installs man-db)"
tmp=$(mktemp -d /tmp/gddr-man.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# render PAGE: the page as plain text, one paragraph per line as far as
# possible (wide, no hyphenation, no justification); fails on any warning.
render() {
  local out=$tmp/$(basename "$1").txt
  LC_ALL=C.UTF-8 MANWIDTH=250 MANPAGER=cat PAGER=cat timeout 30 \
    man --warnings --no-hyphenation --no-justification -l "$1" > "$out" 2> "$out.err" ||
    { cat "$out.err" >&2; fail "man -l $1 failed"; }
  [ ! -s "$out.err" ] || { cat "$out.err" >&2; fail "man -l $1 warned"; }
  # (groff may print U+2010/U+2212 for - : back to ASCII for the matching.)
  sed -e 's/\xe2\x80\x90/-/g' -e 's/\xe2\x88\x92/-/g' "$out"
}
# The programs of the gddr-ps package (make install's bin/) and their pages.
declare -A help=(
  [gddr-ps]="$BIN/gddr-ps --help"
  [gddr-ctl]="$BIN/gddr-ctl --help"
  [gddr-train]="$BIN/gddr-train --help"
  [gddr-keygen]="$BIN/gddr-keygen"
  [gddr-bench]="$BIN/gddr-bench --help"
  [gddr-launch]="scripts/launch-local.sh --help"
)
n=0
for prog in "${!help[@]}"; do
  page=$MAN/$prog.1
  [ -f "$page" ] || fail "no manual page $page (make builds it from man/$prog.1.scd)"
  text=$(render "$page")
  grep -q "^NAME" <<< "$text" && grep -q "^ *$prog - " <<< "$text" || fail "$page: no NAME line '$prog - ...'"
  grep -q "^SYNOPSIS" <<< "$text" || fail "$page: no SYNOPSIS"
  # Its options: what --help prints (the usage on stderr for some).
  usage=$(timeout 10 ${help[$prog]} 2>&1 || true)
  [ -n "$usage" ] || fail "$prog printed no usage"
  opts=$(grep -oE '(^|[ [,|])--?[a-zA-Z][a-zA-Z0-9-]*' <<< "$usage" | sed 's/^[ [,|]//' | sort -u || true)
  for o in $opts; do
    grep -qE -- "(^|[^a-zA-Z0-9-])$o([^a-zA-Z0-9-]|$)" <<< "$text" || fail "$page does not name $prog's option $o"
    n=$((n + 1))
  done
done
# The INI format: every key of the table, with its default.
page=$MAN/gddr-ps.ini.5
[ -f "$page" ] || fail "no manual page $page"
text=$(render "$page")
grep -q "^ *gddr-ps.ini - " <<< "$text" || fail "$page: no NAME line"
table=$("$BIN/gddr-ps" --dump-config --markdown)
keys=0
while IFS='|' read -r _ k d _; do
  k=$(sed 's/`//g; s/^ *//; s/ *$//' <<< "$k")
  d=$(sed 's/`//g; s/^ *//; s/ *$//' <<< "$d")
  case "$k" in
    key|---|'') continue ;;
    '**['*) s=${k//\*/}; grep -qxF "   $s" <<< "$text" || fail "$page has no section $s"; continue ;;
  esac
  [ "$d" = '""' ] && d='(empty)'
  grep -qxF "       $k = $d" <<< "$text" || fail "$page: no line '$k = $d' (the key table's default)"
  keys=$((keys + 1))
done <<< "$table"
[ "$keys" -ge 50 ] || fail "only $keys keys in gddr-ps --dump-config --markdown"
for k in $("$BIN/gddr-ps" --dump-config | sed -n 's/^\([a-z_0-9]*\) =.*/\1/p'); do
  grep -q "^       $k = " <<< "$text" || fail "$page does not list $k (gddr-ps --dump-config)"
done
echo "$me: OK (${#help[@]} program pages naming their $n options, gddr-ps.ini(5) with all $keys keys; man -l without warnings)"
