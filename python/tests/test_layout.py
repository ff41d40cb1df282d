"""The ctypes mirror of gddr.h against the C compiler's view of it: every
result struct's size and every field's offset and size, the error table;
and gddr_client_opts, which is not mirrored: the library describes every
field (gddr_opts_describe), reports its size, gives its defaults, and the
options table of docs/python.md is written from that description.
"""

import ctypes
import re

import pytest

import gddr
from gddr import _lib

from conftest import REPO, run

STRUCTS = {
    "gddr_server_info": _lib.ServerInfo,
    "gddr_push_tags": _lib.PushTags,
    "gddr_client_counters": _lib.ClientCounters,
    "gddr_server_stats": _lib.ServerStats,
    "gddr_table_opts": _lib.TableOpts,
}


def c_layout(c_peer):
    """{struct: (size, [(field, offset, size), ...])} as the compiler laid them out."""
    out = {}
    for line in run([c_peer, "layout"]).splitlines():
        parts = line.split()
        if parts[0] in ("default", "opts_size"):
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


def test_options_are_the_fields_of_the_header(c_peer):
    """The library describes every member of gddr_client_opts in gddr.h, in
    order, and reports the size the compiler gives the struct (a field
    appended without its row in common/client_conf.c fails here and in
    gddr-tests opts)."""
    h = (REPO / "client" / "include" / "gddr" / "gddr.h").read_text()
    body = re.search(r"typedef struct gddr_client_opts \{(.*?)\} gddr_client_opts;", h, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = re.findall(r"(\w+)\s*;", body)
    assert names == [d["name"] for d in _lib.describe()]
    size = [int(line.split()[1]) for line in run([c_peer, "layout"]).splitlines()
            if line.startswith("opts_size ")]
    assert size == [_lib.opts_size()]
    assert set(gddr.OPTIONS) == set(names) - {"server", "rank", "world_size", "log", "log_user"}


def test_defaults_round_trip(c_peer):
    """gddr_client_opts_init() in C gives what the library describes and
    gddr.default_options() returns."""
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
    # A fresh struct reads back, option by option, as its description's default.
    o = _lib.Opts()
    for k in gddr.OPTIONS:
        assert gddr.client._typed(k, o.get(k)) == d[k], k


def test_table_opts_defaults_are_the_headers(c_peer):
    """_lib.TableOpts() as filled by Python's register_table defaults is
    GDDR_TABLE_OPTS_INIT, field by field (the layout is checked above)."""
    want = {}
    for line in run([c_peer, "layout"]).splitlines():
        if line.startswith("default table."):
            _, k, v = line.split()
            want[k[len("table."):]] = v
    assert [f for f, _ in _lib.TableOpts._fields_] == list(want)
    assert want["optimizer"] == "NULL"
    defaults = {"init": "zeros", "init_scale": 0.0, "init_seed": 0, "admit": "always",
                "admit_count": 1, "admit_prob": 1.0, "max_rows": 0, "row_ttl": 0}
    import inspect
    sig = inspect.signature(gddr.Client.register_table).parameters
    for k, v in defaults.items():
        assert sig[k].default == v, k
    assert sig["optimizer"].default is None
    assert _lib.TINIT[defaults["init"]] == int(want["init"])
    assert _lib.TADMIT[defaults["admit"]] == int(want["admit"])
    for k in ("init_scale", "admit_prob"):
        assert defaults[k] == float(want[k]), k
    for k in ("init_seed", "admit_count", "max_rows", "row_ttl"):
        assert defaults[k] == int(want[k]), k


def test_options_by_name():
    """gddr_opts_set parses with the option's type and bounds and says what
    is wrong; the client's options read back as set."""
    o = _lib.Opts()
    o.set("dc_mode", "identity")
    assert o.get("dc_mode") == "identity"
    o.set("dc_mode", "0")  # an enum by value too
    assert o.get("dc_mode") == "diag"
    o.set("pull_delta_bits", "16")
    assert o.get("pull_delta_bits") == "16"
    o.set("curve_key_file", "/tmp/k.key")
    assert o.get("curve_key_file") == "/tmp/k.key"
    for name, value, words in [("delay_fractoin", "0.5", "unknown client option 'delay_fractoin'"),
                               ("delay_fraction", "1.5", "out of range"),
                               ("timeout_ms", "soon", "not an integer"),
                               ("dc_mode", "sideways", "not one of diag, identity"),
                               ("log", "0", "gddr_opts_set_ptr")]:
        with pytest.raises(_lib.OptsError, match=words):
            o.set(name, value)


def test_options_table_is_written_from_the_library():
    """docs/python.md's table of options is what the library describes
    (`make config-table` writes it): every keyword Client() takes, with its
    default and help, and nothing else."""
    doc = (REPO / "docs" / "python.md").read_text()
    table = re.search(r"<!-- python-options begin.*?-->\n(.*?)<!-- python-options end -->",
                      doc, re.S)
    assert table, "docs/python.md has no python-options table"
    assert table.group(1) == gddr.client._options_markdown(), (
        "docs/python.md's options table differs from the library's: run `make config-table`")


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
