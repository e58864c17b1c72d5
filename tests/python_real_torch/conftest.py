"""tests/python_real_torch: moejit.Experts and its torch op under a real torch (Debian's
python3-torch, CPU; scripts/setup.sh installs it), on the interpreter. Apart from tests/python
so that its conftest.py (and the torch stand-in) is not loaded here. torch missing is a failure,
not a skip: run `bash scripts/setup.sh`."""
import os
import sys

import numpy as np
import pytest

sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")]
from moejit_testenv import REPO, seed_of, use_test_cache  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "python"))

try:
    import torch  # noqa: F401
except ImportError as e:
    raise ImportError("tests/python_real_torch needs torch in %s (%s): run `bash scripts/setup.sh`, which installs "
                      "Debian's python3-torch" % (sys.executable, e)) from e

use_test_cache()


@pytest.fixture
def rng(request):
    """A test's generator, seeded as tests/python's (printed so a failure can be replayed)."""
    return np.random.default_rng(seed_of(request))
