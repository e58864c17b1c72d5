"""tests/python_real_torch: moejit.Experts and its torch op under a real torch (Debian's
python3-torch, CPU; scripts/setup.sh installs it), on the interpreter. Apart from tests/python
so that its conftest.py (and the torch stand-in) is not loaded here. torch missing is a failure,
not a skip: run `bash scripts/setup.sh`."""
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "python"), os.path.join(REPO, "tests", "python")]

try:
    import torch  # noqa: F401
except ImportError as e:
    raise ImportError("tests/python_real_torch needs torch in %s (%s): run `bash scripts/setup.sh`, which installs "
                      "Debian's python3-torch" % (sys.executable, e)) from e

if not os.environ.get("MOEJIT_CACHE_DIR"):
    if os.environ.get("MJ_TEST_CACHE"):
        os.environ["MOEJIT_CACHE_DIR"] = os.environ["MJ_TEST_CACHE"]
    else:  # a cache of this run's own, removed when it ends
        import atexit
        import shutil
        import tempfile
        _own_cache = tempfile.mkdtemp(prefix="moejit-pytest-cache-")
        atexit.register(shutil.rmtree, _own_cache, True)
        os.environ["MOEJIT_CACHE_DIR"] = _own_cache
os.environ.setdefault("MOEJIT_SIM_THREADS", "2")


@pytest.fixture
def rng(request):
    """A test's generator: $MJ_TEST_SEED, else a fixed seed; printed so a failure can be replayed."""
    s = int(os.environ.get("MJ_TEST_SEED", "1234"))
    print("%s: seed %d (replay with MJ_TEST_SEED=%d)" % (request.node.name, s, s))
    return np.random.default_rng(s)
