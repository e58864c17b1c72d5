"""What every Python test directory sets up the same way (tests/python's conftest.py and
tests/python_real_torch's): the checkout's root, the kernel cache, and a test's seed."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def use_test_cache():
    """Kernels compile into $MOEJIT_CACHE_DIR, else $MJ_TEST_CACHE (the suite's shared cache),
    else a cache of this run's own, removed when it ends; the interpreter on 2 threads."""
    if not os.environ.get("MOEJIT_CACHE_DIR"):
        if os.environ.get("MJ_TEST_CACHE"):
            os.environ["MOEJIT_CACHE_DIR"] = os.environ["MJ_TEST_CACHE"]
        else:
            import atexit
            import shutil
            import tempfile
            own = tempfile.mkdtemp(prefix="moejit-pytest-cache-")
            atexit.register(shutil.rmtree, own, True)
            os.environ["MOEJIT_CACHE_DIR"] = own
    os.environ.setdefault("MOEJIT_SIM_THREADS", "2")


def seed_of(request):
    """A test's seed: $MJ_TEST_SEED, else a fixed one; printed so a failure can be replayed."""
    s = int(os.environ.get("MJ_TEST_SEED", "1234"))
    print("%s: seed %d (replay with MJ_TEST_SEED=%d)" % (request.node.name, s, s))
    return s
