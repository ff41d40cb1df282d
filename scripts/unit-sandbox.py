#!/usr/bin/python3
"""Runs a command under a systemd unit's system-call filter, as systemd would.

    scripts/unit-sandbox.py UNIT [--deny CALL]... -- COMMAND [ARGS...]

Reads the unit's SystemCallFilter= lines (the first an allow list, each
"~" line taking calls out of it, as systemd does), expands the @groups with
`systemd-analyze syscall-filter` (this machine's systemd, the one that would
run the unit), and loads that seccomp filter: a call outside it kills the
process (SIGSYS), systemd's default without SystemCallErrorNumber=. With
SystemCallArchitectures=native only this machine's ABI is allowed, and with
MemoryDenyWriteExecute=yes the kernel's PR_SET_MDWE is set where it has one
(Linux 6.3). Then it execs COMMAND. --deny takes one more call out (the
test's control: a filter without io_uring must kill a checkpointing daemon).
Needs python3-seccomp (scripts/install-deps.sh).
"""
import ctypes
import os
import subprocess
import sys

import seccomp


def unit_settings(path):
    settings = {}
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;" or "=" not in line or line.startswith("["):
                continue
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def expand(names, seen=None):
    """Set of call names behind names (calls and @groups, nested)."""
    seen = set() if seen is None else seen
    calls = set()
    for name in names:
        if not name.startswith("@"):
            calls.add(name)
            continue
        if name in seen:
            continue
        seen.add(name)
        out = subprocess.run(["systemd-analyze", "syscall-filter", name], check=True,
                             capture_output=True, text=True).stdout
        members = [l.strip() for l in out.splitlines()[1:]
                   if l.strip() and not l.strip().startswith("#")]
        calls |= expand(members, seen)
    return calls


def main(argv):
    if "--" not in argv or len(argv) < 4:
        sys.exit(__doc__)
    sep = argv.index("--")
    unit, opts, command = argv[1], argv[2:sep], argv[sep + 1:]
    deny = {opts[i + 1] for i in range(len(opts) - 1) if opts[i] == "--deny"}
    s = unit_settings(unit)
    filters = s.get("SystemCallFilter", [])
    if not filters or filters[0].startswith("~"):
        sys.exit("unit-sandbox: %s has no SystemCallFilter= allow list" % unit)
    allowed = set()
    for spec in filters:
        names = spec.lstrip("~").split()
        if spec.startswith("~"):
            allowed -= expand(names)
        else:
            allowed |= expand(names)
    allowed -= deny
    if s.get("SystemCallArchitectures", [""])[-1] != "native":
        sys.exit("unit-sandbox: only SystemCallArchitectures=native is modelled")
    kill = getattr(seccomp, "KILL_PROCESS", seccomp.KILL)
    f = seccomp.SyscallFilter(defaction=kill)  # native ABI only, no_new_privs set
    unknown = []
    for call in sorted(allowed):
        try:
            f.add_rule(seccomp.ALLOW, call)
        except (RuntimeError, ValueError):
            unknown.append(call)  # not a call of this ABI (e.g. 32-bit only)
    if s.get("MemoryDenyWriteExecute", ["no"])[-1] == "yes":
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
        if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
            print("unit-sandbox: no PR_SET_MDWE in this kernel: MemoryDenyWriteExecute not modelled",
                  file=sys.stderr)
    f.load()
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv)
