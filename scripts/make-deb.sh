#!/usr/bin/env bash
# make deb: the Debian packages of this build, made with debhelper from
# debian/ (debian/rules), into $BUILD/deb/:
#
#   gddr-ps               the daemon and the tools (gddr-ps, gddr-ctl,
#                         gddr-keygen, gddr-train, gddr-bench, gddr-launch),
#                         their manual pages and gddr-ps.ini(5), the systemd
#                         unit (dh_installsystemd; DynamicUser: no system user
#                         to create; not enabled or started at install),
#                         /etc/gddr/gddr-ps.ini (a conffile), the docs an
#                         operator needs
#   libgddr-client0       the shared library in /usr/lib/<multiarch>/ (shlibs,
#                         symbols, the ldconfig trigger)
#   libgddr-client-dev    headers, the static library, the .so link, pkg-config
#   python3-gddr          the gddr package (it loads libgddr-client0's library)
#   libgddr-client0-cuda  the CUDA plugin, in /usr/lib/<multiarch>/gddr/, when
#                         this build made one (nvcc found); it needs NVIDIA's
#                         CUDA runtime, not a Debian package (its Description
#                         says which)
#
# dh runs on a copy of debian/ under $BUILD/debian-tree, with copies of the
# files the packages document, so that everything it writes stays under
# $BUILD; nothing is compiled there: debian/rules installs this build with
# `make install PREFIX=/usr LIBDIR=/usr/lib/<multiarch>`. Binaries are
# stripped (no -dbgsym packages); Depends come from dh_shlibdeps. The
# packages are lintian-clean: scripts/test-deb.sh checks it.
#
#   scripts/make-deb.sh [BUILD]      (BUILD: the build folder, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
me=make-deb
fail() { echo "$me: $*" >&2; exit 1; }
for t in dh dh_python3 dpkg-architecture dpkg-parsechangelog objdump; do
  command -v "$t" > /dev/null || fail "$t not found (scripts/install-deps.sh installs debhelper, dh-python, dpkg-dev)"
done
version=$(sed -n 's/^VERSION *:= *//p' Makefile)
changelog=$(dpkg-parsechangelog -l debian/changelog -S Version)
[ "$version" = "$changelog" ] || fail "debian/changelog's version is $changelog, the Makefile's $version: add a changelog entry"
[ -d "$BUILD/man" ] && [ -n "$(ls "$BUILD/man")" ] || fail "no manual pages in $BUILD/man (scdoc missing? scripts/install-deps.sh)"
top=$PWD
b=$(cd "$BUILD" && pwd)
tree=$b/debian-tree
out=$b/deb
rm -rf "$tree"
mkdir -p "$tree/docs" "$out"
cp -r debian config README.md "$tree/"
cp docs/operations.md docs/protocol.md "$tree/docs/"
# The unit of config/ with the package's paths (its hardening unchanged),
# and the package's own header in place of the hand-install notes.
{
  echo "# gddr-ps.service -- the GDDR parameter server under systemd (Debian package gddr-ps)."
  echo "#"
  echo "# Edit /etc/gddr/gddr-ps.ini (at least listen and checkpoint_dir = /var/lib/gddr),"
  echo "# check it with gddr-ps -c /etc/gddr/gddr-ps.ini --check-config, then"
  echo "# systemctl enable --now gddr-ps. See gddr-ps(1), gddr-ps.ini(5) and"
  echo "# /usr/share/doc/gddr-ps/operations.md."
  awk 'body || !/^#/ { body = 1; print }' config/gddr-ps.service |
    sed -e 's#/usr/local/bin/#/usr/bin/#g' \
        -e 's#^Documentation=.*#Documentation=man:gddr-ps(1) man:gddr-ps.ini(5) file:/usr/share/doc/gddr-ps/operations.md#'
} > "$tree/debian/gddr-ps.service"
# A build without the CUDA plugin leaves its package out (a build profile).
plugin=$(make --no-print-directory -s plugin-path BUILD="$BUILD" 2> /dev/null)
profiles=
[ -n "$plugin" ] && [ -f "$plugin" ] || profiles=nocuda
rm -f "$out"/*.deb
if ! (cd "$tree" && GDDR_TOP="$top" GDDR_BUILD="$b" GDDR_DEB_OUT="$out" DEB_BUILD_PROFILES="$profiles" \
        debian/rules binary) > "$tree/dh.log" 2>&1; then
  tail -n 40 "$tree/dh.log" >&2
  fail "debian/rules binary failed (the whole log: $tree/dh.log)"
fi
for deb in "$out"/*.deb; do echo "$me: $deb"; done
