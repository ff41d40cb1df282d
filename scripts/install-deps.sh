#!/usr/bin/env bash
# install-deps.sh -- install the Debian packages GDDR needs, and only those
# that are missing. Safe to run again and again: when everything is there it
# prints one line and touches nothing (no apt-get update, no sudo).
#
#   scripts/install-deps.sh           what building, `make check` and the demo need
#   scripts/install-deps.sh --slurm   and Slurm with munge (make slurm-check)
#
# CUDA is optional and never installed here: the Makefile finds nvcc by
# itself and builds the CPU kernels when there is none.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

pkgs=(
    build-essential       # cc, make, libc headers
    pkg-config
    libzmq3-dev           # transport
    libprotobuf-c-dev     # message headers
    protobuf-c-compiler   # protoc-c, generates build/proto
    liburing-dev          # checkpoint I/O
    check                 # unit test framework
    libinih-dev           # INI parsing for the config table
    libsystemd-dev        # sd_notify: READY=1 and the watchdog
    zlib1g-dev            # gzip-compressed IDX files
    dataset-fashion-mnist # the demo's data set
    python3               # the gddr package, the protocol test, the Python demo
    python3-numpy         # the gddr package's arrays
    python3-torch         # gddr.torch and the Python demo (CPU build)
    python3-pytest        # runs the protocol test (tests/protocol)
    python3-zmq           # the protocol test's own ZeroMQ socket
    python3-protobuf      # the protocol test decodes and encodes gddr.proto
    protobuf-compiler     # protoc --python_out, run by the protocol test
    systemd               # systemd-analyze: the unit's security rating and verify
    python3-seccomp       # runs gddr-ps under the unit's system-call filter (test-unit.sh)
    iproute2              # ip netns and tc: the network experiment and its smoke test
    gnuplot-nox           # the network experiment's pictures (docs/network-*.png)
    scdoc                 # the manual pages (man/*.scd -> build/man/)
    man-db                # man -l: scripts/test-man.sh renders every page
    debhelper             # make deb: dh and its dh_* tools (debian/)
    dh-python             # make deb: dh_python3 for python3-gddr
    lintian               # scripts/test-deb.sh: the packages must be lintian-clean
    python3-pip           # make wheel (pip wheel) and scripts/test-wheel.sh (pip install)
    python3-setuptools    # the wheel's build backend (offline, --no-build-isolation)
    python3-wheel         # setuptools' bdist_wheel
    python3-venv          # scripts/test-wheel.sh installs the wheel into a venv
)

# --slurm: also what scripts/slurm/test-slurm.sh needs (a one-node Slurm
# cluster); not part of the default list, so `make check` does not pay for it.
if [ "${1:-}" = --slurm ]; then
    pkgs+=(
        slurm-wlm             # slurmctld, slurmd, sbatch/srun/scontrol
        munge                 # Slurm's authentication daemon
    )
fi

# The checkpoint code computes CRC32C itself (SSE4.2 or a table), so
# libcrc32c is not needed; Debian 12 has no libcrc32c-dev anyway. Should the
# code ever include <crc32c/crc32c.h>, the package becomes a requirement.
if grep -Eqs '^[[:space:]]*#[[:space:]]*include[[:space:]]*<crc32c/crc32c\.h>' \
    server/checkpoint.c; then
    pkgs+=(libcrc32c-dev)
fi

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for p in "${pkgs[@]}"; do
    installed "$p" || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "deps: all ${#pkgs[@]} packages present"
    exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "deps: missing ${missing[*]}; run as root or install sudo" >&2
        exit 1
    fi
    sudo=(sudo)
fi

echo "deps: installing ${#missing[@]} missing package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"

# apt-get can succeed while leaving a package unconfigured; check again.
still=()
for p in "${missing[@]}"; do
    installed "$p" || still+=("$p")
done
if [ "${#still[@]}" -ne 0 ]; then
    echo "deps: still missing after apt-get: ${still[*]}" >&2
    exit 1
fi
echo "deps: installed ${missing[*]}"
