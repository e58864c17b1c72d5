"""The ctypes prototypes of the binding (python/moejit/_lib.py, _PROTOS) against include/moejit.h,
checked by the C compiler: each one's argument count, argument types and return type, and in
the other direction every function the header exports is bound or listed in NOT_BOUND.

A C file is generated from the table: for each function one
    _Static_assert(__builtin_types_compatible_p(__typeof__(&mj_x), RET (*)(ARGS)), "...");
with RET and ARGS spelled from the ctypes types, and compiled with $CC (else cc) -fsyntax-only
against the header. Most ctypes types name one C type (c_int64 is long, POINTER(S.RouteStatsC)
is mj_route_stats *, c_char_p is const char *); the header's declaration (read from the
preprocessor's output) only picks among what a ctypes type allows:
  - c_int is int, or one of the header's enums (which ctypes passes as an int: their size is
    asserted to be an int's); POINTER(c_int) likewise;
  - c_void_p (_P: data and opaque handles passed as integers) is whatever pointer the header
    has there, and the compiler asserts it is a pointer; POINTER(c_void_p) a pointer to one;
  - POINTER(T) is T * or const T *, as the header has it.
Whatever the reading picks, the compiler then checks the whole prototype, so a misread header
fails the test rather than passing it."""
import ctypes
import os
import re
import subprocess

import pytest

from moejit import _lib, _structs as S
from conftest import REPO

INCLUDE = os.path.join(REPO, "include")
HEADER = os.path.join(INCLUDE, "moejit.h")

# Functions of the header the binding does not call (so does not bind), with why.
NOT_BOUND = {
    "mj_moe_config_parse": "the binding reads configs from files (mj_moe_config_read)",
    "mj_nvfp4_quantize": "NVFP4 packing is the C writer's (mj_checkpoint_make) and the tests'; the binding "
                         "runs layers, it does not quantize tensors",
    "mj_nvfp4_dequantize": "as mj_nvfp4_quantize",
    "mj_nvfp4_quantize_act": "as mj_nvfp4_quantize",
    "mj_nvfp4_dequantize_act": "as mj_nvfp4_quantize",
    "mj_checkpoint_layer_seed": "the seed of a layer is the C writer's business (mj_checkpoint_make)",
    "mj_prewarm_json": "prewarming from a manifest is the moejit command's (moejit prewarm)",
    "mj_router_gemm": "the binding routes from logits (mj_route) or drives the whole layer (mj_moe_*)",
    "mj_router_gemm_workspace": "as mj_router_gemm",
    "mj_experts_create": "the binding drives the whole layer (mj_moe_*), or adopts an engine's experts "
                         "(mj_experts_adopt); it does not pack a layer's experts alone",
    "mj_experts_forward": "adopted experts run on the engine's top-k (mj_experts_forward_topk)",
    "mj_experts_mode": "as mj_experts_create",
}

# The C type ctypes passes for each of its scalar types. c_int32, c_int64, c_uint64, c_size_t
# are other names of these (c_int, c_long, c_ulong here), so int32_t is checked as int and int64_t
# as long: what ctypes really passes. Where long long is long's size, ctypes makes c_longlong
# c_long, so long long comes first and long wins.
_SCALARS = dict([
    (ctypes.c_longlong, "long long"), (ctypes.c_ulonglong, "unsigned long long"),
    (ctypes.c_byte, "signed char"), (ctypes.c_ubyte, "unsigned char"), (ctypes.c_short, "short"),
    (ctypes.c_ushort, "unsigned short"), (ctypes.c_int, "int"), (ctypes.c_uint, "unsigned int"),
    (ctypes.c_long, "long"), (ctypes.c_ulong, "unsigned long"), (ctypes.c_bool, "_Bool"),
    (ctypes.c_float, "float"), (ctypes.c_double, "double"),
    (ctypes.c_char_p, "const char *"), (ctypes.c_void_p, "void *"),
])


def _cc():
    return os.environ.get("CC", "cc")


def _norm(t):
    """A C type's text with one space between tokens and none inside "**"."""
    t = re.sub(r"\s+", " ", t.replace("*", " * ")).strip()
    return t.replace("* *", "**").replace("* *", "**")


def _param_type(p):
    """The type of one parameter declaration (its name dropped): "const float *logits" ->
    "const float *"."""
    p = p.strip()
    m = re.match(r"^(.*?[\s*])(\w+)$", p)
    if m and re.sub(r"\b(const|volatile|restrict)\b", "", m.group(1)).strip():
        p = m.group(1)
    return _norm(p)


def header_functions():
    """{name: (return type, [parameter types])} of every MJ_API function of the header, and the
    names of its enums, from the preprocessor's output (MJ_BUILDING_LIBRARY: MJ_API is then the
    visibility attribute, a mark to find them by)."""
    out = subprocess.run([_cc(), "-E", "-P", "-DMJ_BUILDING_LIBRARY", "-I", INCLUDE, HEADER], check=True,
                         capture_output=True, text=True).stdout
    text = re.sub(r"\s+", " ", out)
    funcs = {}
    for m in re.finditer(r'__attribute__ ?\(\(visibility ?\("default"\)\)\) ([^;(]*?)\b(mj_\w+) ?\(([^;]*?)\) ?;', text):
        ret, name, params = _norm(m.group(1)), m.group(2), m.group(3).strip()
        assert name not in funcs, "%s declared twice" % name
        funcs[name] = (ret, [] if params in ("", "void") else [_param_type(p) for p in params.split(",")])
    enums = set(re.findall(r"typedef enum (?:\w+ )?\{[^}]*\} (\w+) ?;", text))
    return funcs, enums


def _const_from(h):
    return "const " if h and h.startswith("const ") else ""


def _spell(t, h, enums, checks):
    """The C spelling of ctypes type t where the header has parameter type h (None where it has
    no such parameter); appends to checks the static assertions the choice needs."""
    if t is ctypes.c_int and h in enums:
        checks.append(("sizeof(%s) == sizeof(int)" % h, "the enum %s is passed as a c_int" % h))
        return h
    if t is ctypes.c_void_p and h:
        checks.append(("__builtin_classify_type((%s)0) == 5" % h, "c_void_p where the header has %s, not a "
                       "pointer" % h))
        return h
    if t in _SCALARS:
        return _SCALARS[t]
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        pointee = t._type_
        if pointee is ctypes.c_int and h and h.endswith("*") and _norm(h[:-1]).replace("const ", "") in enums:
            e = _norm(h[:-1])
            checks.append(("sizeof(%s) == sizeof(int)" % e, "the enum %s is passed as a c_int" % e))
            return h
        if pointee is ctypes.c_void_p and h:
            checks.append(("__builtin_classify_type((%s)0) == 5 && __builtin_classify_type(*(%s)0) == 5" % (h, h),
                           "POINTER(c_void_p) where the header has %s, not a pointer to a pointer" % h))
            return h
        if pointee in _SCALARS:
            inner = _SCALARS[pointee]
        elif issubclass(pointee, ctypes.Structure) and getattr(pointee, "_c_name_", None):
            inner = pointee._c_name_
        else:
            raise AssertionError("no C spelling for %r" % (t,))
        if not inner.startswith("const "):
            inner = _const_from(h) + inner
        return _norm(inner + " *")
    raise AssertionError("no C spelling for %r" % (t,))


def _ctypes_name(t):
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return "POINTER(%s)" % _ctypes_name(t._type_)
    return getattr(t, "__name__", repr(t))


def _c_file(funcs, enums):
    """The C file of static assertions, and {line: function} of each assertion's line."""
    lines = ['#include "moejit.h"', ""]
    where = {}
    for name, (argtypes, restype) in _lib._PROTOS.items():
        params = funcs.get(name, (None, []))[1]
        checks = []
        ret = "mj_status" if restype is _lib.STATUS else ("void" if restype is None else _spell(restype, None,
                                                                                               enums, checks))
        args = [_spell(t, params[i] if i < len(params) else None, enums, checks) for i, t in enumerate(argtypes)]
        proto = "%s (*)(%s)" % (ret, ", ".join(args) or "void")
        said = "%s(%s) -> %s" % (name, ", ".join(_ctypes_name(t) for t in argtypes),
                                 "mj_status" if restype is _lib.STATUS else _ctypes_name(restype))
        for cond, why in checks:
            where[len(lines) + 1] = name
            lines.append('_Static_assert(%s, "%s: %s");' % (cond, name, why))
        where[len(lines) + 1] = name
        lines.append('_Static_assert(__builtin_types_compatible_p(__typeof__(&%s), %s), '
                     '"_lib.py binds %s, as C %s: not the header\'s prototype");' % (name, proto, said, proto))
    return "\n".join(lines) + "\n", where


@pytest.fixture(scope="module")
def header():
    return header_functions()


@pytest.fixture(scope="module")
def compiled(header, tmp_path_factory):
    """{function: [the compiler's messages about its lines]}, and the messages about no
    function's line (the file as a whole)."""
    src, where = _c_file(*header)
    path = tmp_path_factory.mktemp("prototypes") / "prototypes.c"
    path.write_text(src)
    r = subprocess.run([_cc(), "-std=c11", "-fsyntax-only", "-Wall", "-Werror", "-I", INCLUDE, str(path)],
                       capture_output=True, text=True)
    per, other = {}, []
    for line in r.stderr.splitlines():
        m = re.match(re.escape(str(path)) + r":(\d+):\d+: (?:error|warning)", line)
        if m and int(m.group(1)) in where:
            per.setdefault(where[int(m.group(1))], []).append(line)
        elif m or "error" in line:
            other.append(line)
    assert r.returncode != 0 or not per, r.stderr
    return _Compiled(per, other, r.returncode, src)


class _Compiled(tuple):
    """(per function, other messages, exit status, source), shown short in a failure's report."""

    def __new__(cls, *fields):
        return super().__new__(cls, fields)

    def __repr__(self):
        return "<the compiled check: %d functions failed>" % len(self[0])


@pytest.mark.parametrize("name", list(_lib._PROTOS))
def test_prototype_is_the_headers(name, header, compiled):
    """The ctypes prototype has the header's argument count and compatible types."""
    funcs, _ = header
    assert name in funcs, "_lib.py binds %s, which the header does not declare (MJ_API)" % name
    argtypes, restype = _lib._PROTOS[name]
    ret, params = funcs[name]
    assert len(argtypes) == len(params), "%s: _lib.py passes %d arguments, the header takes %d (%s)" % (
        name, len(argtypes), len(params), ", ".join(params))
    assert (restype is _lib.STATUS) == (ret == "mj_status"), "%s returns %s in the header" % (name, ret)
    per = compiled[0]
    assert name not in per, "\n".join(per[name])


def test_the_check_compiled(compiled):
    """No error outside the per-function assertions (the header and the file compiled), and the
    file holds an assertion for every bound function."""
    per, other, rc, src = compiled
    assert not other, "\n".join(other)
    assert rc == 0 or per
    for name in _lib._PROTOS:
        assert "__typeof__(&%s)" % name in src


def test_every_header_function_is_bound(header):
    """A function added to the header is bound in _lib.py, or listed in NOT_BOUND with why."""
    funcs, _ = header
    assert len(funcs) >= len(_lib._PROTOS)   # the header was read
    unbound = sorted(set(funcs) - set(_lib._PROTOS) - set(NOT_BOUND))
    assert not unbound, "not bound in python/moejit/_lib.py, nor listed in NOT_BOUND: " + ", ".join(unbound)
    stale = sorted(set(NOT_BOUND) - set(funcs))
    assert not stale, "NOT_BOUND lists functions the header does not declare: " + ", ".join(stale)
    both = sorted(set(NOT_BOUND) & set(_lib._PROTOS))
    assert not both, "bound, yet listed in NOT_BOUND: " + ", ".join(both)


def test_header_is_read_whole(header):
    """The reading of the header finds every MJ_API declaration of its text (one a line start)."""
    funcs, enums = header
    text = open(HEADER).read()
    declared = set(re.findall(r"^MJ_API\b[^(]*?\b(mj_\w+)\s*\(", text, re.M))
    assert declared == set(funcs)
    assert {"mj_status", "mj_parallel", "mj_weight_mode", "mj_backend"} <= enums
