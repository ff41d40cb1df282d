#!/usr/bin/env bash
# make deb: Debian packages of this build, made with dpkg-deb, into $BUILD/deb/:
#
#   gddr-ps             the daemon and the tools (gddr-ps, gddr-ctl, gddr-keygen,
#                       gddr-train, gddr-bench, gddr-launch), the systemd unit (DynamicUser:
#                       no system user to create), /etc/gddr/gddr-ps.ini (a
#                       conffile), the docs an operator needs
#   libgddr-client0     the shared library (not a CUDA build's plugin: the CUDA
#                       runtime it needs is not a Debian package here)
#   libgddr-client-dev  headers, the static library, the .so link, pkg-config
#
# Installed under /usr. Depends: the Debian packages that hold the libraries
# the binaries name (NEEDED), found with dpkg -S on this machine; -dev
# depends on the -dev packages its pkg-config file requires. Nothing is
# started or enabled at install: `systemctl enable --now gddr-ps`.
# (The Python package stays with `make install`.)
#
#   scripts/make-deb.sh [BUILD]      (BUILD: the build folder, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
me=make-deb
version=$(sed -n 's/^VERSION *:= *//p' Makefile)
arch=$(dpkg --print-architecture)
out=$BUILD/deb
stage=$(mktemp -d /tmp/gddr-deb.XXXXXX)
trap 'rm -rf "$stage"' EXIT
make --no-print-directory install PREFIX=/usr DESTDIR="$stage/all" PYTHON_SITE= > "$stage/install.log"
a=$stage/all/usr

# deps FILE...: the packages holding the libraries the files name directly.
deps() {
  local f so path c pkg
  for f in "$@"; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue # (gddr-launch: a script)
    for so in $(objdump -p "$f" | awk '$1 == "NEEDED" { print $2 }'); do
      path=$(ldd "$f" | awk -v so="$so" '$1 == so { print $3 }')
      [ -n "$path" ] || continue
      for c in "$path" "/usr$path" "$(readlink -f "$path")" "/usr$(readlink -f "$path")"; do
        pkg=$(dpkg -S "$c" 2>/dev/null | head -n 1 | cut -d: -f1) || true
        [ -n "$pkg" ] && { echo "$pkg"; break; }
      done
    done
  done | sort -u | paste -sd, | sed 's/,/, /g'
}

# control DIR PACKAGE DEPENDS DESCRIPTION...
control() {
  local dir=$1 pkg=$2 dep=$3
  shift 3
  mkdir -p "$dir/DEBIAN"
  {
    echo "Package: $pkg"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: GDDR developers <gddr@localhost>"
    echo "Section: net"
    echo "Priority: optional"
    [ -z "$dep" ] || echo "Depends: $dep"
    echo "Installed-Size: $(du -sk --exclude=DEBIAN "$dir" | cut -f1)"
    echo "Description: $1"
    shift
    for line in "$@"; do echo " $line"; done
  } > "$dir/DEBIAN/control"
  find "$dir" -path "$dir/DEBIAN" -prune -o -type f -printf '%P\0' | sort -z |
    (cd "$dir" && xargs -0 -r md5sum) > "$dir/DEBIAN/md5sums"
}

# gddr-ps
d=$stage/gddr-ps
install -d "$d/usr/bin" "$d/lib/systemd/system" "$d/etc/gddr" "$d/usr/share/doc/gddr-ps"
for b in gddr-ps gddr-ctl gddr-keygen gddr-train gddr-bench gddr-launch; do install -m 755 "$a/bin/$b" "$d/usr/bin/"; done
install -D -m 644 "$a/share/gddr/lib.sh" "$d/usr/share/gddr/lib.sh" # gddr-launch's helpers
# The unit of `make install` with /usr paths, and the package's own header
# in place of its install notes.
{
  echo "# gddr-ps.service -- the GDDR parameter server under systemd (Debian package gddr-ps)."
  echo "#"
  echo "# Edit /etc/gddr/gddr-ps.ini (at least listen and checkpoint_dir = /var/lib/gddr),"
  echo "# check it with gddr-ps -c /etc/gddr/gddr-ps.ini --check-config, then"
  echo "# systemctl enable --now gddr-ps. See /usr/share/doc/gddr-ps/operations.md."
  awk 'body || !/^#/ { body = 1; print }' config/gddr-ps.service |
    sed -e 's#/usr/local/bin/#/usr/bin/#g' \
        -e 's#file:/usr/local/share/gddr/gddr-ps.ini#file:/usr/share/doc/gddr-ps/operations.md#g'
} > "$d/lib/systemd/system/gddr-ps.service"
chmod 644 "$d/lib/systemd/system/gddr-ps.service"
install -m 644 config/gddr-ps.ini "$d/etc/gddr/gddr-ps.ini"
install -m 644 config/gddr-client.ini config/grafana-gddr-ps.json README.md docs/operations.md \
  docs/protocol.md "$d/usr/share/doc/gddr-ps/"
mkdir -p "$d/DEBIAN"
echo /etc/gddr/gddr-ps.ini > "$d/DEBIAN/conffiles"
control "$d" gddr-ps "$(deps "$d"/usr/bin/*)" \
  "GDDR parameter server for distributed training" \
  "gddr-ps holds a model's float32 tensors and applies the gradients workers" \
  "push over ZeroMQ (async, sync, ssp; staleness-aware steps, checkpoints," \
  "CURVE). With gddr-ctl, gddr-keygen, the gddr-train trainer and a" \
  "hardened systemd unit (not enabled at install)."

# libgddr-client0
l=$stage/libgddr-client0
install -d "$l/usr/lib"
install -m 644 "$a/lib/libgddr-client.so.0" "$l/usr/lib/"
control "$l" libgddr-client0 "$(deps "$l/usr/lib/libgddr-client.so.0")" \
  "GDDR parameter-server client library" \
  "libgddr-client: pull parameters from and push gradients to gddr-ps."

# libgddr-client-dev
v=$stage/libgddr-client-dev
install -d "$v/usr/lib/pkgconfig" "$v/usr/include/gddr"
install -m 644 "$a/lib/libgddr-client.a" "$v/usr/lib/"
ln -s libgddr-client.so.0 "$v/usr/lib/libgddr-client.so"
install -m 644 "$a/lib/pkgconfig/gddr-client.pc" "$v/usr/lib/pkgconfig/"
install -m 644 "$a"/include/gddr/*.h "$v/usr/include/gddr/"
control "$v" libgddr-client-dev \
  "libgddr-client0 (= $version), libzmq3-dev, libprotobuf-c-dev, libinih-dev" \
  "GDDR parameter-server client library: development files" \
  "Headers, static library and pkg-config file (gddr-client) of libgddr-client."

mkdir -p "$out"
rm -f "$out"/*.deb
for p in gddr-ps libgddr-client0 libgddr-client-dev; do
  dpkg-deb --root-owner-group --build "$stage/$p" "$out/${p}_${version}_$arch.deb" > /dev/null
  echo "$me: $out/${p}_${version}_$arch.deb"
done
