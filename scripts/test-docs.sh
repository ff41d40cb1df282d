#!/usr/bin/env bash
# The repository stands alone: no tracked file cites a document outside it
# (the design contract the project started from, the seed folder next to
# it), and every citation of docs/design.md names a section that exists.
#
#   - the upper-case name of the outside design contract (its bare name,
#     its .md file name, or "<name> section N") is refused: cite
#     "docs/design.md section N" instead;
#   - a path into the folder that holds the checkout (the one up one level
#     from the repository, or its seed folder) is refused;
#   - "docs/design.md section N", "sections N-M", "sections N, M and K"
#     (also wrapped over comment lines) must name sections 1..last of
#     docs/design.md ("## N. " headings), and "section 6 step K" a step
#     that section 6 lists.
#
# Tracked files only (git ls-files); outside a git checkout (a release
# tarball) every file under the tree but build/.
set -euo pipefail
cd "$(dirname "$0")/.."
me=test-docs
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  list=$(git ls-files)
else
  list=$(find . -path ./build -prune -o -type f -print | sed 's|^\./||')
fi
tmp=$(mktemp /tmp/gddr-docs.XXXXXX)
trap 'rm -f "$tmp"' EXIT
printf '%s\n' "$list" > "$tmp"
/usr/bin/python3 - "$me" "$tmp" <<'PY'
import os, re, sys
me = sys.argv[1]
files = [f for f in open(sys.argv[2]).read().split("\n") if f and os.path.isfile(f)]
this = "scripts/test-docs.sh"
# Built so that this script does not match itself.
word = "DES" + "IGN"
bad_word = re.compile(r"\b" + word + r"\b")
bad_path = re.compile(r"\.\./" + "shared|(?<![\w/.-])" + "shared/" + "seeds")
design = open("docs/design.md", encoding="utf-8").read()
sections = {int(n) for n in re.findall(r"^## (\d+)\. ", design, re.M)}
sec6 = re.search(r"^## 6\. .*?(?=^## 7\. )", design, re.M | re.S)
steps = {int(n) for n in re.findall(r"^(\d+)\. \*\*", sec6.group(0), re.M)} if sec6 else set()
cite = re.compile(r"docs/design\.md\s+sections?\s+((?:\d+(?:\s*-\s*\d+)?(?:\s*,\s*|\s+and\s+)?)+)"
                  r"(?:\s*,?\s*\(?\s*steps?\s+(\d+)(?:\s*-\s*(\d+))?)?")
problems, ncite = [], 0
for f in files:
    if f == this:
        continue
    try:
        text = open(f, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue  # binary files (images, data)
    for i, line in enumerate(text.split("\n"), 1):
        if bad_word.search(line):
            problems.append("%s:%d: cites the outside design file (write docs/design.md section N): %s"
                            % (f, i, line.strip()))
        if bad_path.search(line):
            problems.append("%s:%d: points outside the repository: %s" % (f, i, line.strip()))
    # Citations may wrap over comment lines: join them first.
    flat = re.sub(r"\s*\n\s*(?:\*(?!/)|#|//|;)?\s*", " ", text)
    for m in cite.finditer(flat):
        ncite += 1
        nums = set()
        for a, b in re.findall(r"(\d+)(?:\s*-\s*(\d+))?", m.group(1)):
            nums.update(range(int(a), int(b or a) + 1))
        for n in sorted(nums - sections):
            problems.append("%s: '%s' names section %d, which docs/design.md does not have"
                            % (f, m.group(0).strip(), n))
        if m.group(2):
            want = set(range(int(m.group(2)), int(m.group(3) or m.group(2)) + 1))
            if nums != {6} or want - steps:
                problems.append("%s: '%s' names a step docs/design.md section 6 does not list"
                                % (f, m.group(0).strip()))
if not sections or not steps:
    problems.append("docs/design.md has no numbered sections or section 6 no numbered steps")
if problems:
    print("%s: FAIL:\n  %s" % (me, "\n  ".join(problems)), file=sys.stderr)
    sys.exit(1)
print("%s: OK (%d files; %d citations of docs/design.md, all to its sections 1-%d; nothing cites "
      "a file outside the repository)" % (me, len(files), ncite, max(sections)))
PY
