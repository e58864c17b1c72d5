"""NcclComm and nccl_unique_id through the test stand-ins for libnccl.so.2 and libcuda.so.1
(build/libnccl_stub.so, build/libcuda_stub.so, loaded through MOEJIT_NCCL / MOEJIT_LIBCUDA):
the id's 128 bytes, a one-rank group whose all-reduce the stub carries out on host memory
("CUDA" tensors of the torch stand-in), NCCL's error text in CommError, and the message when
NCCL is missing. Each runs in a fresh interpreter (the libraries are loaded once a process).
Not run here: real NCCL on GPUs."""
import os
import subprocess
import sys

import pytest

from moejit import _lib
from conftest import REPO

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = r"""
import sys
import numpy as np
import conftest, moejit
sys.modules["torch"] = conftest.make_fake_torch()
T = sys.modules["torch"]
uid = moejit.nccl_unique_id()
assert isinstance(uid, bytes) and len(uid) == 128
comm = moejit.NcclComm(uid, 1, 0)
assert (comm.kind, comm.rank, comm.n_ranks) == ("nccl", 0, 1)
x = conftest.FakeTensor(np.arange(6, dtype=np.float32).reshape(2, 3), T.float32, "cuda:0")
y = comm.all_reduce(x)
assert isinstance(y, conftest.FakeTensor) and str(y.device) == "cuda:0"
assert y.numpy().tolist() == x.numpy().tolist(), y.numpy()
try:
    comm.all_reduce(np.zeros(3, np.float32))
except ValueError as e:
    assert "device memory" in str(e)
else:
    raise AssertionError("host memory to an NCCL comm was not refused")
print("ok", flush=True)
import os
os.environ["MJ_STUB_NCCL_FAIL"] = "ncclAllReduce:5"
try:
    comm.all_reduce(x)
except moejit.CommError as e:
    print("comm error:", e.status_name, e.message)
comm.close()
"""


def _run(script, **env):
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    e.update(env)
    e["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python"), HERE])
    e["MOEJIT_LIBRARY"] = _lib.load()
    return subprocess.run([sys.executable, "-c", script], env=e, capture_output=True, text=True, timeout=120)


def _stub(name):
    p = os.path.join(os.path.dirname(os.path.realpath(_lib.load())), name)
    if not os.path.exists(p):
        pytest.skip("%s is not beside the library (a build directory's)" % name)
    return p


def test_nccl_comm_through_the_stubs(tmp_path):
    r = _run(SCRIPT, MOEJIT_NCCL=_stub("libnccl_stub.so"), MOEJIT_LIBCUDA=_stub("libcuda_stub.so"),
             MJ_STUB_LOG=str(tmp_path / "stub.log"))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "ok"
    assert lines[1].startswith("comm error: MJ_ERR_COMM") and "NCCL_DEBUG=INFO" in lines[1], lines
    log = (tmp_path / "stub.log").read_text()
    assert "ncclGetUniqueId" in log and "ncclCommInitRank" in log
    # 6 floats, enqueued on torch's current stream (the stand-in's)
    from conftest import FAKE_STREAM
    assert "count=6 datatype=7 op=0" in log and "stream=0x%x" % FAKE_STREAM in log, log


def test_nccl_missing():
    r = _run("import moejit\ntry:\n    moejit.nccl_unique_id()\nexcept moejit.SharedLibraryError as e:\n"
             "    print(e.status_name, e.message)\n", MOEJIT_NCCL="/nonexistent/libnccl.so.2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("MJ_ERR_LIBRARY") and "/nonexistent/libnccl.so.2" in r.stdout
