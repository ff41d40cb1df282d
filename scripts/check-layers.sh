#!/usr/bin/env bash
# The layering rules, checked on the build (make check runs it):
#
#   daemon    gddr-ps holds no client code: no global symbol that an object
#             of client/src defines is defined in it (gddr_client_open,
#             gddr_step_submit, the shard and heartbeat code, ...).
#   includes  no include cycle among the files of one folder (from the
#             sources: #include "x.h" naming a file of the same folder).
#   calls     no call cycle among the files of one folder: file A calls B
#             when A's object needs a symbol (nm: U) that B's object defines
#             (T, D, B, R, i, ...); objects of build/obj/FOLDER whose source
#             is still there.
#   size      no source file (.c .h .cu .cuh .py .sh) over 700 lines outside
#             a tests/ folder.
#   face      in client/src only api.c defines public functions (gddr_*,
#             not gddr__*): the public face is one file.
#
# Known exceptions are listed below, each with its reason. The list may
# only shrink: an exception that the check no longer needs fails the check
# too, so it cannot outlive its cause.
#
# Usage: scripts/check-layers.sh [BUILD]   (BUILD: the build folder, default
# the parent of $GDDR_BIN, else build)
set -euo pipefail
cd "$(dirname "$0")/.."
me=check-layers
build=${1:-$(dirname "${GDDR_BIN:-build/bin}")}
status=0
fail() { echo "$me: FAIL: $*" >&2; status=1; }

# One line each: "call FOLDER/A.c -> FOLDER/B.c" (a call edge allowed to
# close a cycle), "include A -> B" (likewise for an include), "size FILE"
# (a file allowed over the limit). Keep the reason in a comment above.
exceptions=$(cat <<'EOF'
# (none: keep it so)
EOF
)

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
[ "$status" -eq 0 ] && echo "$me: gddr-ps holds none of the client's $(echo "$client_syms" | wc -l) global symbols"

# ---- face: only api.c defines gddr_* in client/src ---------------------------
face=$(for o in "${objs[@]}"; do
         [ "$(basename "$o")" = api.o ] && continue
         [ -e "client/src/$(basename "$o" .o).c" ] || continue   # a stale object
         nm --defined-only "$o" | awk -v o="$(basename "$o" .o).c" '$2 == "T" && $3 ~ /^gddr_[a-z0-9]/ { print o ": " $3 }'
       done)
if [ -n "$face" ]; then
  fail "public functions defined outside client/src/api.c:"
  echo "$face" | sed 's/^/  /' >&2
fi
[ -e "$build/cpu/obj/client/src/api.o" ] && nm --defined-only "$build/cpu/obj/client/src/api.o" | grep -q ' T gddr_client_open$' ||
  fail "client/src/api.o does not define gddr_client_open: the face check would prove nothing"

# ---- includes, calls, size --------------------------------------------------
folders=(common kernels client/src client/train server tools)
for f in "${folders[@]}"; do
  [ -d "$f" ] || fail "folder $f is gone: update the folder list of $0"
done
# nm of every object, "OBJECT<TAB>TYPE<TAB>SYMBOL", for the script below.
nmout=$(mktemp /tmp/gddr-layers.XXXXXX)
trap 'rm -f "$nmout"' EXIT
for f in "${folders[@]}"; do
  for o in "$build/obj/$f"/*.o; do
    [ -e "$o" ] || continue
    nm "$o" | awk -v o="$o" 'NF == 3 { print o "\t" $2 "\t" $3 } NF == 2 { print o "\t" $1 "\t" $2 }'
  done
done > "$nmout"
EXCEPTIONS=$exceptions python3 - "$build" "$nmout" "${folders[@]}" <<'PY' || status=1
import os, re, sys

build, nmfile, folders = sys.argv[1], sys.argv[2], sys.argv[3:]
LIMIT = 700
bad = []

exc = {"call": set(), "include": set(), "size": set()}
for line in os.environ["EXCEPTIONS"].splitlines():
    line = line.split("#")[0].strip()
    if not line:
        continue
    kind, _, rest = line.partition(" ")
    if kind == "size":
        exc["size"].add(rest.strip())
    elif kind in ("call", "include") and "->" in rest:
        a, b = (x.strip() for x in rest.split("->"))
        exc[kind].add((a, b))
    else:
        bad.append("exception line not understood: %r" % line)


def reaches(g, a, b):
    """Whether b is reachable from a in g (node -> set of nodes)."""
    seen, todo = {a}, [a]
    while todo:
        n = todo.pop()
        if n == b:
            return True
        for m in g.get(n, ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return False


def cycles(g):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def judge(kind, g, why=None):
    """Fails on a cycle of g left after the exceptions of this kind, and on
    an exception that is not needed (g without the other exceptions has no
    cycle through it)."""
    allowed = exc[kind]
    cut = {a: {b for b in bs if (a, b) not in allowed} for a, bs in g.items()}
    for comp in cycles(cut):
        edges = ["%s -> %s%s" % (a, b, why(a, b) if why else "")
                 for a in comp for b in sorted(cut[a]) if b in comp]
        bad.append("%s cycle among %s:\n    %s" % (kind, ", ".join(comp), "\n    ".join(edges)))
    for a, b in sorted(allowed):
        if a not in g and b not in g:
            continue  # another folder's exception
        rest = {x: {y for y in ys if (x, y) == (a, b) or (x, y) not in allowed} for x, ys in g.items()}
        if b not in g.get(a, ()) or not reaches(rest, b, a):
            bad.append("exception '%s %s -> %s' is no longer needed: remove it" % (kind, a, b))


# Includes: #include "x" naming a file of the same folder.
inc_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
for f in folders:
    files = sorted(os.path.join(f, n) for n in os.listdir(f)
                   if re.search(r"\.(c|h|cu|cuh)$", n) and os.path.isfile(os.path.join(f, n)))
    g = {}
    for path in files:
        with open(path, errors="replace") as fh:
            text = fh.read()
        g[path] = {os.path.normpath(os.path.join(f, m)) for m in inc_re.findall(text)
                   if os.path.normpath(os.path.join(f, m)) in files and
                   os.path.normpath(os.path.join(f, m)) != path}
    judge("include", g)

# Calls: from nm of each object whose source is still there.
defs, undefs = {}, {}
for line in open(nmfile).read().splitlines():
    obj, typ, sym = line.split("\t")
    rel = os.path.relpath(obj, os.path.join(build, "obj"))
    src = rel[:-len(".cu.o")] + ".cu" if rel.endswith(".cu.o") else rel[:-2] + ".c"
    if not os.path.isfile(src):
        continue  # a stale object
    if typ in "Uw":
        undefs.setdefault(src, set()).add(sym)
    elif typ in "TDBRCVWGSi":
        defs.setdefault(os.path.dirname(src), {}).setdefault(sym, set()).add(src)
    undefs.setdefault(src, set())
for f in folders:
    d = defs.get(f, {})
    g = {}
    for src in sorted(s for s in undefs if os.path.dirname(s) == f):
        g[src] = {o for sym in undefs[src] for o in d.get(sym, ()) if o != src}
    if not g:
        bad.append("no objects of %s under %s/obj (run make)" % (f, build))

    def why(a, b, d=d):
        syms = sorted(sym for sym in undefs[a] if b in d.get(sym, ()))
        return " (%s%s)" % (", ".join(syms[:4]), ", ..." if len(syms) > 4 else "")
    judge("call", g, why)

# Size.
big = set()
for root, dirs, names in os.walk("."):
    dirs[:] = [x for x in dirs if x not in (".git", "tests", "build") and not x.startswith("build")]
    for n in names:
        if re.search(r"\.(c|h|cu|cuh|py|sh)$", n):
            path = os.path.relpath(os.path.join(root, n))
            if os.path.islink(path):
                continue
            with open(path, errors="replace") as fh:
                lines = sum(1 for _ in fh)
            if lines > LIMIT:
                big.add(path)
                if path not in exc["size"]:
                    bad.append("%s has %d lines (at most %d outside tests/)" % (path, lines, LIMIT))
for path in sorted(exc["size"] - big):
    bad.append("exception 'size %s' is no longer needed: remove it" % path)

for b in bad:
    print("check-layers: FAIL: " + b, file=sys.stderr)
left = sum(len(v) for v in exc.values())
if not bad:
    print("check-layers: no include or call cycle within %s; no source file over %d lines; "
          "%d known exception%s left" % (", ".join(folders), LIMIT, left, "" if left == 1 else "s"))
sys.exit(1 if bad else 0)
PY
exit "$status"
