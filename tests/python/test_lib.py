"""Finding libmoejit.so: $MOEJIT_LIBRARY, beside the package, the checkout's build/, the
loader's path; what a missing, broken or mismatched library says; pip install of the package.
Each case runs in a fresh interpreter (the library is loaded once per process)."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from moejit import _lib
from conftest import REPO

PY = sys.executable


def _run(code, env_extra=None, cwd=None, path=None):
    env = {k: v for k, v in os.environ.items() if k not in ("MOEJIT_LIBRARY", "PYTHONPATH", "LD_LIBRARY_PATH")}
    env.update(env_extra or {})
    env["PYTHONPATH"] = path or os.path.join(REPO, "python")
    return subprocess.run([PY, "-c", code], env=env, cwd=cwd or "/", capture_output=True, text=True, timeout=120)


LOAD = "import moejit; print(moejit.library_path()); print(moejit.library_version())"


def test_import_needs_no_library():
    r = _run("import moejit; print(moejit.__version__)", {"MOEJIT_LIBRARY": "/nonexistent/libmoejit.so"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == _lib.__version__


def test_moejit_library_missing_says_where_it_looked():
    r = _run(LOAD, {"MOEJIT_LIBRARY": "/nonexistent/libmoejit.so"})
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr
    assert "$MOEJIT_LIBRARY: /nonexistent/libmoejit.so (not there)" in r.stderr
    assert "MOEJIT_LIBRARY=/path/to/libmoejit.so" in r.stderr


def test_package_outside_a_checkout_without_library(tmp_path):
    pkg = tmp_path / "site"
    shutil.copytree(os.path.join(REPO, "python", "moejit"), pkg / "moejit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so*"))
    r = _run(LOAD, path=str(pkg))
    assert r.returncode != 0
    assert "beside the package: %s (not there)" % (pkg / "moejit" / "libmoejit.so") in r.stderr
    assert "the loader's search path" in r.stderr
    assert "checkout" not in r.stderr.split("Looked in:")[1].split("Build it")[0]
    assert "MOEJIT_LIBRARY" in r.stderr and "LD_LIBRARY_PATH" in r.stderr


def test_library_beside_the_package_is_found(tmp_path):
    pkg = tmp_path / "site"
    shutil.copytree(os.path.join(REPO, "python", "moejit"), pkg / "moejit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(_lib.load(), pkg / "moejit" / "libmoejit.so")
    r = _run(LOAD, path=str(pkg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(pkg / "moejit" / "libmoejit.so"), _lib.__version__]


def test_checkout_build_is_found():
    if not os.path.exists(os.path.join(REPO, "build", "libmoejit.so")):
        pytest.skip("no build/libmoejit.so in this checkout")
    r = _run(LOAD)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == os.path.join(REPO, "build", "libmoejit.so")


def test_a_file_that_does_not_load(tmp_path):
    bad = tmp_path / "libmoejit.so"
    bad.write_bytes(b"not an ELF file")
    r = _run(LOAD, {"MOEJIT_LIBRARY": str(bad)})
    assert r.returncode != 0
    assert "%s ($MOEJIT_LIBRARY) exists but does not load" % bad in r.stderr


def test_version_mismatch_is_refused():
    code = "import moejit._lib as L; L.__version__ = '9.9.0'; L.load()"
    r = _run(code, {"MOEJIT_LIBRARY": _lib.load()})
    assert r.returncode != 0
    assert "LibraryVersionError" in r.stderr and "needs 9.9.x" in r.stderr
    assert "is version %s;" % _lib.__version__ in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="setuptools is not installed")
def test_pip_install(tmp_path):
    """pip install of python/ (a copy, so the checkout gets no build/ or egg-info), offline,
    then the installed package with the library copied beside it. Its metadata has the
    version pyproject.toml reads from moejit/_version.py."""
    src = tmp_path / "src"
    shutil.copytree(os.path.join(REPO, "python"), src, ignore=shutil.ignore_patterns("__pycache__", "build",
                                                                                 "*.egg-info", "*.so*"))
    shutil.copy(_lib.load(), src / "moejit" / "libmoejit.so")
    target = tmp_path / "target"
    r = subprocess.run([PY, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps", "--no-index",
                        "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / ("moejit-%s.dist-info" % _lib.__version__)).is_dir(), sorted(os.listdir(target))
    r = _run(LOAD, path=str(target))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(target / "moejit" / "libmoejit.so"), _lib.__version__]


def _header_version():
    """include/moejit.h's MJ_VERSION_MAJOR.MINOR.PATCH, the version's one source."""
    text = open(os.path.join(REPO, "include", "moejit.h")).read()
    parts = [re.findall(r"^#define MJ_VERSION_%s +([0-9]+)$" % p, text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
    assert all(len(p) == 1 for p in parts), parts
    return ".".join(p[0] for p in parts)


def test_versions_agree(tmp_path):
    """Every place the version is written is the header's: MJ_VERSION_STRING as the compiler
    makes it, the package (moejit/_version.py), pyproject.toml (which reads that file), the
    loaded library, and CMake's project() (which reads the header): its CMakeCache.txt and the
    library's file name, where the library is a build's."""
    want = _header_version()
    src = tmp_path / "version.c"
    src.write_text('#include "moejit.h"\nconst char *v = MJ_VERSION_STRING;\n')
    out = subprocess.run([os.environ.get("CC", "cc"), "-E", "-P", "-I", os.path.join(REPO, "include"), str(src)],
                         check=True, capture_output=True, text=True).stdout
    line = [x for x in out.splitlines() if "const char *v" in x][0]
    assert "".join(re.findall(r'"([^"]*)"', line)) == want, line

    import moejit
    from moejit import _version
    assert moejit.__version__ == _lib.__version__ == _version.__version__ == want

    with open(os.path.join(REPO, "python", "pyproject.toml"), "rb") as f:
        text = f.read().decode()
    try:
        import tomllib
        project = tomllib.loads(text)
    except ImportError:  # Python < 3.11: the lines themselves
        project = None
    if project is not None:
        assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
        assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "moejit._version.__version__"}
    else:
        assert not re.search(r"^version *=", text, re.M)
        assert re.search(r'^version = \{attr = "moejit._version.__version__"\}$', text, re.M)

    path = os.path.realpath(_lib.load())
    assert moejit.library_version() == want
    m = re.search(r"\.so\.([0-9.]+)$", path)
    if m:
        assert m.group(1) == want, path
    cache = os.path.join(os.path.dirname(path), "CMakeCache.txt")
    if os.path.exists(cache):
        versions = re.findall(r"^CMAKE_PROJECT_VERSION:STATIC=(.*)$", open(cache).read(), re.M)
        assert versions == [want], cache
    cmake = open(os.path.join(REPO, "CMakeLists.txt")).read()
    assert not re.search(r"project\(moejit VERSION [0-9]", cmake), "CMakeLists.txt writes the version itself"
