"""The serving engines' real sources, from PyPI: sglang 0.5.23 and vllm 0.34.0 wheels
(`pip download --no-deps`), their .py files unpacked into $MJ_ENGINE_SOURCES (default
~/.cache/moejit-engines/NAME-VERSION). scripts/setup.sh runs this file once on a fresh machine;
the tests call sources() too, which downloads what is missing and fails (never skips) when it
cannot. Run as a script: fetch both and print where they are."""
import os
import subprocess
import sys
import tempfile
import zipfile

ENGINES = {"sglang": "0.5.23", "vllm": "0.34.0"}
# What the tests read of each wheel (its .py files under these folders).
KEEP = {"sglang": ("sglang/srt/layers/", "sglang/srt/plugins/"),
        "vllm": ("vllm/model_executor/layers/quantization/", "vllm/model_executor/layers/fused_moe/",
                 "vllm/plugins/")}


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
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if r.returncode != 0 or not wheels:
            raise RuntimeError("could not download %s %s from PyPI (%s): %s\nThe engine tests read its real "
                               "sources; run scripts/setup.sh with network access, or set MJ_ENGINE_SOURCES to "
                               "a directory holding %s-%s/ unpacked" %
                               (name, version, " ".join(cmd), (r.stderr or r.stdout).strip()[-800:], name, version))
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
            for n in z.namelist():
                if n.endswith(".py") and n.startswith(KEEP[name]):
                    z.extract(n, d)
    open(os.path.join(d, ".complete"), "w").close()
    return d


if __name__ == "__main__":
    for n in ENGINES:
        print("%s %s: %s" % (n, ENGINES[n], sources(n)))
