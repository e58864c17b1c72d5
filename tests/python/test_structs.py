"""The ctypes mirrors of include/moejit.h (python/moejit/_structs.py) against the C compiler:
every mirrored struct's size, each field's offset and size, the initializer macros' values,
the enum constants and the mj_status names. A small C program is generated from the mirrors,
compiled with $CC (else cc) against the header, and its output compared."""
import ctypes
import os
import re
import subprocess

import pytest

from moejit import _structs as S
from moejit.errors import STATUS_NAMES
from conftest import REPO

HEADER = os.path.join(REPO, "include", "moejit.h")
# Structs of the header the binding does not pass to C (so does not mirror), with why.
NOT_MIRRORED = {
    "mj_nvfp4_linear": "a field of the opaque layer; the binding never builds one",
}


def _scalar(ctype):
    return not issubclass(ctype, (ctypes.Structure, ctypes.Array))


def _c_program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include \"moejit.h\"", "int main(void) {"]
    for cls in S.ALL:
        t = cls._c_name_
        lines.append('    printf("size %s %%zu\\n", sizeof(%s));' % (t, t))
        for f, ft in cls._fields_:
            lines.append('    printf("field %s %s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));' %
                         (t, f, t, f, t, f))
        if cls._c_init_:
            lines.append("    { %s v = %s;" % (t, cls._c_init_))
            for f, ft in cls._fields_:
                if not _scalar(ft):
                    continue
                if ft in (ctypes.c_void_p, ctypes.c_char_p):
                    lines.append('      printf("init %s %s %%d\\n", v.%s != NULL);' % (t, f, f))
                else:
                    lines.append('      printf("init %s %s %%.9g\\n", (double)v.%s);' % (t, f, f))
            lines.append("    }")
    for name in S.CONSTANTS:
        lines.append('    printf("const %s %%lld\\n", (long long)(%s));' % (name, name))
    for name in STATUS_NAMES:
        lines.append('    printf("status %s %%d\\n", (int)%s);' % (name, name))
    lines.append('    printf("status MJ_STATUS_COUNT %d\\n", (int)MJ_STATUS_COUNT);')
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def c_facts(tmp_path_factory):
    d = tmp_path_factory.mktemp("structs")
    src, exe = d / "layout.c", d / "layout"
    src.write_text(_c_program())
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(REPO, "include"), str(src), "-o",
                    str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    facts = {}
    for line in out.splitlines():
        kind, *rest = line.split()
        facts[(kind,) + tuple(rest[:-1] if kind != "field" else rest[:2])] = (
            rest[-1] if kind != "field" else tuple(int(x) for x in rest[2:]))
    return facts


@pytest.mark.parametrize("cls", S.ALL, ids=[c._c_name_ for c in S.ALL])
def test_struct_layout(cls, c_facts):
    t = cls._c_name_
    assert ctypes.sizeof(cls) == int(c_facts[("size", t)]), "sizeof(%s)" % t
    for f, ft in cls._fields_:
        off, size = c_facts[("field", t, f)]
        assert getattr(cls, f).offset == off, "offsetof(%s, %s)" % (t, f)
        assert getattr(cls, f).size == size, "sizeof(%s.%s)" % (t, f)
    if "struct_size" in dict(cls._fields_):
        assert cls().struct_size == ctypes.sizeof(cls)


@pytest.mark.parametrize("cls", [c for c in S.ALL if c._c_init_], ids=[c._c_init_ for c in S.ALL if c._c_init_])
def test_initializer_values(cls, c_facts):
    """cls() holds the values of the header's initializer macro."""
    v = cls()
    for f, ft in cls._fields_:
        if not _scalar(ft):
            continue
        want = c_facts[("init", cls._c_name_, f)]
        got = getattr(v, f)
        if ft in (ctypes.c_void_p, ctypes.c_char_p):
            assert int(got is not None) == int(want), "%s.%s" % (cls._c_init_, f)
        else:
            assert float(got) == pytest.approx(float(want), rel=1e-7), "%s.%s" % (cls._c_init_, f)


def test_constants_and_statuses(c_facts):
    for name, value in S.CONSTANTS.items():
        assert int(c_facts[("const", name)]) == value, name
    for i, name in enumerate(STATUS_NAMES):
        assert int(c_facts[("status", name)]) == i, name
    assert int(c_facts[("status", "MJ_STATUS_COUNT")]) == len(STATUS_NAMES)


def test_every_public_struct_is_mirrored():
    """A struct added to the header is mirrored, or listed in NOT_MIRRORED with a reason."""
    text = open(HEADER).read()
    structs = set(re.findall(r"typedef struct (mj_\w+) \{", text))
    mirrored = {c._c_name_ for c in S.ALL}
    assert mirrored <= structs
    assert structs - mirrored == set(NOT_MIRRORED)
