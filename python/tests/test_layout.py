"""The ctypes mirror of gddr.h against the C compiler's view of it: every
struct's size and every field's offset and size, the defaults of
gddr_client_opts_init() read through the mirror, and the error table.
A field added to gddr.h without its twin in python/gddr/_lib.py fails here.
"""

import ctypes
import re

import gddr
from gddr import _lib

from conftest import REPO, run

STRUCTS = {
    "gddr_client_opts": _lib.ClientOpts,
    "gddr_server_info": _lib.ServerInfo,
    "gddr_push_tags": _lib.PushTags,
    "gddr_client_counters": _lib.ClientCounters,
    "gddr_server_stats": _lib.ServerStats,
}


def c_layout(c_peer):
    """{struct: (size, [(field, offset, size), ...])} as the compiler laid them out."""
    out = {}
    for line in run([c_peer, "layout"]).splitlines():
        parts = line.split()
        if parts[0] == "default":
            continue
        name, field, off, size = parts[0], parts[1], int(parts[2]), int(parts[3])
        if field == "-":
            out[name] = (size, [])
        else:
            out[name][1].append((field, off, size))
    return out


def test_structs_match_the_compiler(c_peer):
    c = c_layout(c_peer)
    assert set(c) == set(STRUCTS)
    for name, cls in STRUCTS.items():
        size, fields = c[name]
        assert ctypes.sizeof(cls) == size, "sizeof(%s): C %d, ctypes %d" % (
            name, size, ctypes.sizeof(cls))
        py = [(f, getattr(cls, f).offset, getattr(cls, f).size) for f, _ in cls._fields_]
        assert py == fields, "%s: C fields %s, ctypes %s" % (name, fields, py)


def test_fields_are_those_of_the_header():
    """Every member of gddr_client_opts in gddr.h is in the mirror, in order
    (a field the layout helper does not print yet is caught here)."""
    h = (REPO / "client" / "include" / "gddr" / "gddr.h").read_text()
    body = re.search(r"typedef struct gddr_client_opts \{(.*?)\} gddr_client_opts;", h, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = re.findall(r"(\w+)\s*;", body)
    assert names == [f for f, _ in _lib.ClientOpts._fields_]


def test_defaults_round_trip(c_peer):
    """gddr_client_opts_init() through the ctypes struct gives what C sees."""
    want = {}
    for line in run([c_peer, "layout"]).splitlines():
        if line.startswith("default "):
            _, k, v = line.split()
            want[k] = v
    d = gddr.default_options()
    assert d["timeout_ms"] == int(want["timeout_ms"]) == 5000
    assert d["seed"] == int(want["seed"]) == 12345  # the INI's default too
    assert d["part_bytes"] == 4 << 20
    assert d["heartbeat_ms"] == int(want["heartbeat_ms"]) == 2000
    assert repr(d["dc_ms_decay"]) == repr(float(want["dc_ms_decay"]))
    assert d["delay_fraction"] == 0.0 and d["observer"] == 0 and d["async_pipeline"] == 1


def test_error_table_matches_gddr_h():
    """One class per row of GDDR_ERRORS, with its code, name and the
    library's own sentence (the list is common/gddr_base.h, which gddr.h
    includes)."""
    h = (REPO / "common" / "gddr_base.h").read_text()
    rows = re.findall(r'X\((GDDR_\w+), (\d+), "([^"]*)"\)', h)
    assert len(rows) >= 21
    for name, num, text in rows:
        code = int(num)
        assert gddr.strerror(code) == text
        if code == 0:
            continue
        cls = gddr.errors.BY_CODE[code]
        assert issubclass(cls, gddr.Error)
        assert (cls.code, cls.name) == (code, name)
    assert len(gddr.errors.BY_CODE) == len(rows) - 1
    # A code from a newer library still raises a gddr.Error with that code.
    e = gddr.errors.from_code(99, "new")
    assert type(e) is gddr.Error and e.code == 99


def test_every_option_is_documented():
    """docs/python.md names every field of gddr_client_opts, and its table
    of options has a row for each keyword Client() takes (gddr.OPTIONS),
    with the default gddr_client_opts_init() gives: an option added to
    gddr.h without a line in the docs fails here."""
    doc = (REPO / "docs" / "python.md").read_text()
    missing = [f for f, _ in _lib.ClientOpts._fields_ if "`%s`" % f not in doc]
    assert not missing, "docs/python.md does not mention %s" % ", ".join(missing)
    table = re.search(r"<!-- python-options begin.*?-->\n(.*?)<!-- python-options end -->",
                      doc, re.S)
    assert table, "docs/python.md has no python-options table"
    rows = {}
    for line in table.group(1).splitlines():
        m = re.match(r"\| `(\w+)` \| ([^|]+) \|", line)
        if m:
            assert m.group(1) not in rows, "option %s listed twice" % m.group(1)
            rows[m.group(1)] = m.group(2).strip().strip("`")
    assert sorted(rows) == sorted(gddr.OPTIONS), (
        "table lacks %s, has extra %s" % (sorted(set(gddr.OPTIONS) - set(rows)),
                                          sorted(set(rows) - set(gddr.OPTIONS))))
    defaults = gddr.default_options()
    names = dict(gddr.DC_MODES, **gddr.LOG_LEVELS)
    for name, cell in rows.items():
        if cell in ("True", "False"):
            value = int(cell == "True")
        elif cell == "None":
            value = None
        elif cell.startswith('"'):
            value = names[cell.strip('"')]
        else:
            value = float(cell)
        assert value == defaults[name], "docs/python.md: %s defaults to %r, the library to %r" % (
            name, cell, defaults[name])
