"""The real sources moejit meets, from PyPI: the serving engines' (sglang 0.5.23 and vllm
0.34.0 wheels) and torch's (2.14.1, the torch sglang 0.5.23 pins; vllm 0.34.0 pins 2.14.0), by
`pip download --no-deps --only-binary=:all:`, the .py and .pyi files the tests read unpacked
into $MJ_ENGINE_SOURCES (default ~/.cache/moejit-engines/NAME-VERSION). torch comes from its
macOS arm64 wheel: 127 MB where the Linux x86_64 one is 555 MB (CUDA libraries), with the same
bytes in every .py and .pyi file but torch/version.py, and PyPI has no torch sdist.
scripts/setup.sh runs this file once on a fresh machine; the tests call sources() too, which
downloads what is missing and fails (never skips) when it cannot. Run as a script: fetch them
all and print where they are."""
import os
import subprocess
import sys
import tempfile
import zipfile

ENGINES = {"sglang": "0.5.23", "vllm": "0.34.0", "torch": "2.14.1"}
# What the tests read of each wheel (its .py and .pyi files under these folders, or these files).
KEEP = {"sglang": ("sglang/srt/layers/", "sglang/srt/plugins/"),
        "vllm": ("vllm/model_executor/layers/quantization/", "vllm/model_executor/layers/fused_moe/",
                 "vllm/plugins/"),
        "torch": ("torch/library.py", "torch/_library/", "torch/_ops.py", "torch/__init__.py", "torch/_C/__init__.pyi",
                  "torch/_C/_VariableFunctions.pyi")}
# The wheel taken where it is not this machine's (pip's --platform and --python-version).
PLATFORM = {"torch": ("macosx_14_0_arm64", "3.11")}


def root():
    return os.environ.get("MJ_ENGINE_SOURCES") or os.path.join(os.path.expanduser("~"), ".cache", "moejit-engines")


def sources(name):
    """The directory holding engine `name`'s package sources (downloaded when missing)."""
    version = ENGINES[name]
    d = os.path.join(root(), "%s-%s" % (name, version))
    if os.path.exists(os.path.join(d, ".complete")):
        return d
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
               "--disable-pip-version-check", "-d", tmp, "%s==%s" % (name, version)]
        if name in PLATFORM:
            cmd[-1:-1] = ["--platform", PLATFORM[name][0], "--python-version", PLATFORM[name][1]]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if r.returncode != 0 or not wheels:
            raise RuntimeError("could not download %s %s from PyPI (%s): %s\nThe tests read its real "
                               "sources; run scripts/setup.sh with network access, or set MJ_ENGINE_SOURCES to "
                               "a directory holding %s-%s/ unpacked" %
                               (name, version, " ".join(cmd), (r.stderr or r.stdout).strip()[-800:], name, version))
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
            for n in z.namelist():
                if n.endswith((".py", ".pyi")) and n.startswith(KEEP[name]):
                    z.extract(n, d)
    open(os.path.join(d, ".complete"), "w").close()
    return d


if __name__ == "__main__":
    for n in ENGINES:
        print("%s %s: %s" % (n, ENGINES[n], sources(n)))
