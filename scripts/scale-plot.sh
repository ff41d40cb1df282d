#!/usr/bin/env bash
# docs/scale.md's plots from scripts/scalesim.py --sweep output: predicted
# step time vs workers, one panel per link rate, one colour per server count;
# dense solid, GDDR both ways (alpha 0.4 pushes, 8-bit delta pulls) dashed,
# GDDR pushes with dense pulls dotted.
#
# Usage: scripts/scale-plot.sh SWEEP.dat MODE OUT.png TITLE
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 4 ] || { echo "usage: $0 SWEEP.dat MODE OUT.png TITLE" >&2; exit 2; }
dat=$1 mode=$2 out=$3 title=$4
command -v gnuplot >/dev/null || { echo "scale-plot: gnuplot is missing (scripts/install-deps.sh)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/gddr-scale-plot.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
panel() {   # $1 link gbit
  local cmd="plot" sep="" c=1 s sel
  for s in 1 4 16 64; do
    sel="$tmp/$1-$s.dat"
    awk -v m="$mode" -v g="$1" -v s="$s" '$3 == m && $4 == g && $5 == s' "$dat" > "$sel"
    cmd+="$sep '$sel' u 6:(\$7/1000) w lp lw 2 pt 7 ps 0.6 lc $c t 'S=$s dense',"
    cmd+=" '$sel' u 6:(\$8/1000) w lp lw 2 dt 2 pt 6 ps 0.6 lc $c t 'S=$s GDDR+q8',"
    cmd+=" '$sel' u 6:(\$9/1000) w l lw 1 dt 3 lc $c t 'S=$s GDDR push'"
    sep=","
    c=$((c + 1))
  done
  echo "set title '$1 Gbit/s'"
  echo "$cmd"
}
gnuplot <<GP
set terminal pngcairo size 1500,560 noenhanced
set output '$out'
set multiplot layout 1,3 title '$title'
set logscale x 2
set logscale y 10
set xlabel 'workers W'; set ylabel 'step time (s)'
set grid; set key top left font ',7'
$(panel 10)
unset key
$(panel 25)
$(panel 100)
unset multiplot
GP
echo "$out"
